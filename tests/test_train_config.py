"""Training configuration: TOML in, CLI overrides, validation, TOML out."""
from __future__ import annotations

import tomllib

import pytest

import g3mpi.nn  # noqa: F401 (torch: the settings import it on first use, here not inside a test's time)
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
                                       ('device = "gpu"', "device 'gpu': expected one of cpu, cuda, auto"),
                                       ('cuda-aware = "yes"', "cuda_aware 'yes': expected one of auto, on, off"),
                                       ('oversubscribe_gpus = 1', "oversubscribe_gpus must be true or false"),
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


def test_config_path_that_is_not_a_readable_file(tmp_path, monkeypatch):
    """A directory or a FIFO is named as such (it was "no such config file"; a FIFO was not read, which would
    block), a file that cannot be read says why (it was an OSError traceback)."""
    import os
    from pathlib import Path
    (tmp_path / "dir.toml").mkdir()
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "locked.toml").write_text("epochs = 1\n")
    read_text = Path.read_text

    def denied(self, *a, **kw):
        if self.name == "locked.toml":
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *a, **kw)
    monkeypatch.setattr(Path, "read_text", denied)
    for name, what in [("dir.toml", "is a directory, not a config file"),
                       ("fifo.toml", "is a special file, not a config file"),
                       ("locked.toml", "cannot be read: Permission denied")]:
        with pytest.raises(ConfigError) as e:
            config_from(tmp_path / name)
        assert str(e.value) == f"{tmp_path / name}: {what}"


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
        if name == "comm_timeout":   # (stored as -1, given as auto)
            shown = "auto"
        assert f"default {shown}" in helps[name], (name, helps[name])
    assert "sgd" in helps["momentum"].lower()


GAT_REASON = "the model is {}, and attention heads are GAT's"
NO_CACHE = "there is no parameter-free product of the input to keep: "
# a setting with no effect on the run: as given on the command line and in a TOML file, the settings beside it (on
# the command line: they have an effect and must not warn), the number of ranks, the run's other facts, and why
NO_EFFECT = [
    ("--momentum 0.9", "momentum = 0.9", dict(momentum=0.9), {}, 2, {},
     "the optimizer is adam, and momentum is SGD's (optimizer sgd)"),
    ("--heads 4", "heads = 4", dict(heads=4), {}, 2, {}, GAT_REASON.format("gcn")),
    ("--out-heads 2", "out-heads = 2", dict(out_heads=2), dict(model="sage"), 2, {}, GAT_REASON.format("sage")),
    ("--attn-dropout 0.3", "attn_dropout = 0.3", dict(attn_dropout=0.3), {}, 2, {},
     "the model is gcn, and attention dropout is GAT's"),
    ("--heads 4", "heads = 4", dict(heads=4), dict(model="gat", layers=1), 2, {},
     "with one layer there is no hidden layer (the last layer has out_heads heads)"),
    ("--activation elu", 'activation = "elu"', dict(activation="elu"), dict(layers=1), 2, {},
     "with one layer there is no hidden layer (the last layer has no activation)"),
    ("--chunk-rows 64", "chunk-rows = 64", dict(chunk_rows=64), dict(model="gat"), 2, {},
     "GAT computes its attention without row chunks (GCN and SAGE chunk their products)"),
    ("--chunk-rows -1", "chunk_rows = -1", dict(chunk_rows=-1), dict(schedule="blocking"), 2, {},
     "the blocking schedule computes without chunks unless chunk_rows is positive"),
    ("--chunk-rows -1", "chunk_rows = -1", dict(chunk_rows=-1), {}, 1, {},
     "one rank, with no messages to poll for, computes without chunks unless chunk_rows is positive"),
    ("--schedule blocking", 'schedule = "blocking"', dict(schedule="blocking"), {}, 1, {},
     "one rank has no halo to exchange: every schedule computes the same way"),
    ("--sim-net 10Gbit,20us", 'sim-net = "10Gbit,20us"', dict(sim_net="10Gbit,20us"), {}, 1, {},
     "one rank sends no messages"),
    ("--sim-net 1Gbit,1ms", 'sim_net = "1Gbit,1ms"', dict(sim_net="1Gbit,1ms"), dict(schedule="nocomm"), 2, {},
     "the nocomm schedule sends no messages"),
    ("--comm-timeout 30.0", "comm-timeout = 30.0", dict(comm_timeout=30.0), {}, 1, {}, "one rank waits for no other"),
    ("--no-input-cache", "input_cache = false", dict(input_cache=False), {}, 2, dict(input_cache_applies=False),
     NO_CACHE + "the first layer has more input features than outputs, so it multiplies by its weight before it "
                "aggregates"),
    ("--no-input-cache", "input-cache = false", dict(input_cache=False), dict(model="gat"), 2,
     dict(input_cache_applies=False), NO_CACHE + "GAT's first layer weighs its input before it aggregates"),
    ("--checkpoint-every 10", "checkpoint_every = 10", dict(checkpoint_every=10), dict(epochs=10), 2, {},
     "the run ends at epoch 10, where the checkpoint is written anyway"),
    ("--patience 4", "patience = 4", dict(patience=4), dict(epochs=10, eval_every=2), 2, {},
     "the run could stop at epoch 10 at the soonest (the best at epoch 2, then 4 evaluations every 2 epochs), not "
     "before its last epoch 10"),
    ("--patience 1", "patience = 1", dict(patience=1), dict(epochs=2), 2, {},
     "the run could stop at epoch 2 at the soonest (the best at epoch 1, then 1 evaluation every 1 epoch), not "
     "before its last epoch 2"),
    ("--patience 10", "patience = 10", dict(patience=10), dict(epochs=10, init_from="m.pt"), 2, {},
     "the run could stop at epoch 10 at the soonest (the best at epoch 0, then 10 evaluations every 1 epoch), not "
     "before its last epoch 10"),
    ("--seed 3", "seed = 3", dict(seed=3), dict(init_from="m.pt", dropout=0.0), 2, {},
     "the parameters come from init_from and no dropout is drawn"),
    ("--seed 3", "seed = 3", dict(seed=3), dict(dropout=0.0), 2, dict(resuming=True),
     "the parameters come from the checkpoint and no dropout is drawn"),
    ("--force", "force = true", dict(force=True), {}, 2, dict(resuming=True),
     "a resumed run continues in its run directory: nothing is replaced"),
    ("--cuda-aware on", 'cuda-aware = "on"', dict(cuda_aware="on"), {}, 2, {},
     "the device is cpu (--device cuda or auto uses GPUs)"),
    ("--oversubscribe-gpus", "oversubscribe_gpus = true", dict(oversubscribe_gpus=True), dict(device="cpu"), 1, {},
     "the device is cpu (--device cuda or auto uses GPUs)"),
]


@pytest.mark.parametrize("cli,toml,setting,others,world,facts,why", NO_EFFECT)
def test_a_setting_without_effect_is_named_once_where_it_was_given(tmp_path, cli, toml, setting, others, world,
                                                                  facts, why):
    """One line, naming the setting as the user wrote it, where (the command line or the TOML file) and why; the
    settings beside it (which do have an effect) say nothing, and neither does the setting at its default."""
    from g3mpi.train.config import config_and_origins, ineffective_settings
    cfg, given = config_and_origins(None, {**others, **setting})
    assert ineffective_settings(cfg, given, world_size=world, **facts) == [f"command line: {cli} has no effect: {why}"]
    (tmp_path / "run.toml").write_text(toml + "\n")
    cfg, given = config_and_origins(tmp_path / "run.toml", others)
    assert ineffective_settings(cfg, given, world_size=world, **facts) == [
        f"{tmp_path / 'run.toml'}: {toml} has no effect: {why}"]
    (key, value), = setting.items()
    default = TrainConfig.__dataclass_fields__[key].default
    for source in ({**others, key: default}, {**others}):   # set to the default, or not set at all
        cfg, given = config_and_origins(None, source)
        assert ineffective_settings(cfg, given, world_size=world, **facts) == [], source


@pytest.mark.parametrize("overrides,world,facts", [
    (dict(optimizer="sgd", momentum=0.9), 2, {}),
    (dict(model="gat", heads=4, out_heads=2, attn_dropout=0.3, layers=2), 2, {}),
    (dict(activation="elu", layers=2), 2, {}),
    (dict(chunk_rows=-1), 2, {}),                                  # pipelined on 2 ranks: chunks unless told not to
    (dict(chunk_rows=64, schedule="blocking"), 2, {}),             # a positive count chunks in every schedule,
    (dict(chunk_rows=64), 1, {}),                                  # on any number of ranks
    (dict(schedule="nocomm", comm_timeout=5.0, input_cache=True), 2, {}),
    (dict(sim_net="10Gbit,20us"), 2, {}),
    (dict(remat="none"), 2, {}),                                   # (cheap, the default, is said nowhere:
    (dict(remat="none", model="appnp"), 2, {}),                    # appnp keeps what it saves either way)
    (dict(input_cache=False), 2, dict(input_cache_applies=True)),
    (dict(checkpoint_every=9, epochs=10), 2, {}),
    (dict(patience=3, epochs=10, eval_every=2), 2, {}),            # the best at 2, 3 evaluations on: it stops at 8
    (dict(patience=9, epochs=10, init_from="m.pt"), 2, {}),        # the best at 0 (init_from), 9 on: at 9
    (dict(patience=50, epochs=10), 2, dict(resuming=True)),        # (the checkpoint's count of evaluations adds)
    # evaluation only: saved for a --resume that trains
    (dict(epochs=0, init_from="m.pt", checkpoint_every=5, patience=3, lr=0.1, optimizer="sgd", momentum=0.9), 2, {}),
    (dict(seed=3, init_from="m.pt"), 2, {}),                       # dropout 0.5 draws from the seed
    (dict(seed=3, init_from="m.pt", dropout=0.0, model="gat", attn_dropout=0.1), 2, {}),
    (dict(force=True), 2, {}),
    (dict(device="cuda", cuda_aware="off", oversubscribe_gpus=True), 2, {}),
    (dict(device="auto", cuda_aware="on"), 1, {}),
])
def test_settings_with_an_effect_are_not_named(overrides, world, facts):
    from g3mpi.train.config import config_and_origins, ineffective_settings
    cfg, given = config_and_origins(None, overrides)
    assert ineffective_settings(cfg, given, world_size=world, **facts) == []


def test_origins_of_the_settings(tmp_path):
    """Where each setting was given: the command line wins over the file; keys as the file spells them."""
    from g3mpi.train.config import Given, config_and_origins
    (tmp_path / "run.toml").write_text('attn-dropout = 0.3\nheads = 4\nmodel = "gat"\n')
    cfg, given = config_and_origins(tmp_path / "run.toml", dict(heads=2, lr=None, verify=False))
    f = str(tmp_path / "run.toml")
    assert given == {"attn_dropout": Given(f, "attn-dropout"), "heads": Given(None, "heads"),
                     "model": Given(f, "model"), "verify": Given(None, "verify")}
    assert [given[k].show(getattr(cfg, k)) for k in given] == [
        f"{f}: attn-dropout = 0.3", "command line: --heads 2", f"{f}: model = \"gat\"", "command line: --no-verify"]


def test_unknown_keys_and_options_say_what_was_meant(tmp_path):
    """A mistyped TOML key or option names the setting it is closest to; one close to none gets no guess."""
    from g3mpi.cli.train import BadCommandLine, build_parser
    toml = tmp_path / "run.toml"
    for text, what in [("hiden = 4\n", "unknown key 'hiden' (did you mean 'hidden'?)"),
                       ("weight-decey = 0.1\n", "unknown key 'weight-decey' (did you mean 'weight_decay'?)"),
                       ("zzz = 1\n", "unknown key 'zzz'")]:
        toml.write_text(text)
        with pytest.raises(ConfigError) as e:
            config_from(str(toml))
        assert str(e.value) == f"{toml}: {what}"
    for argv, what in [(["--hiden", "4"], "--hiden 4 (did you mean '--hidden'?)"), (["--zzzz"], "--zzzz (g3")]:
        with pytest.raises(BadCommandLine) as e:
            build_parser().parse_args(argv)
        assert str(e.value).startswith(f"unrecognized arguments: {what}")


def test_the_settings_name_the_models_and_activations_of_g3mpi_nn():
    """The configuration names them without importing torch (g3-train --help); they are g3mpi.nn's."""
    from g3mpi import nn
    from g3mpi.nn import norm, recipe
    from g3mpi.train import config
    assert config.MODELS == recipe.MODELS and config.ACTIVATIONS == tuple(nn.ACTIVATIONS)
    assert config.NORMS == norm.NORMS and config.JKS == recipe.JKS


def test_saved_config_keeps_auto_and_progress_follows_the_terminal():
    """config.toml writes the adaptive deadline as "auto" (it wrote -1.0) and reads it back; the progress bar is on
    only where stderr is a terminal unless forced (--progress, progress = true), off with --no-progress."""
    import io
    import tomllib

    from g3mpi.train.config import to_toml
    from g3mpi.train.trainer import show_progress
    cfg = TrainConfig()
    saved = tomllib.loads(to_toml(cfg))
    assert saved["comm_timeout"] == "auto" and saved["progress"] == "auto"
    assert config_from(overrides=dict(comm_timeout=saved["comm_timeout"])).comm_timeout == cfg.comm_timeout

    class Tty(io.StringIO):
        def isatty(self):
            return True
    assert [show_progress(TrainConfig(progress=p).progress, io.StringIO()) for p in ("auto", True, False)] == \
        [False, True, False]
    assert show_progress("auto", Tty()) and not show_progress("off", Tty())
    assert config_from(overrides=dict(progress=True)).progress == "on"
