"""Training configuration: one frozen dataclass, read from TOML (stdlib ``tomllib``) plus overrides, saved back
as TOML (``RUN/config.toml``) so a run can be repeated with ``--config RUN/config.toml``. Imports no torch:
g3-train reads and checks its settings, and prints its --help, before it imports torch."""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from g3mpi.options import did_you_mean
from g3mpi.sched import MODES, PIPELINED, Schedule

#: the names of g3mpi.nn's models (its LAYERS) and activations, here without torch, so that the settings and
#: g3-train --help import none (tests/test_train_config.py checks that they are g3mpi.nn's)
MODELS = ("gcn", "sage", "gat")
ACTIVATIONS = ("relu", "elu", "gelu", "leaky_relu", "tanh")
OPTIMIZERS = ("adam", "sgd")
#: torch threads per rank at most (a larger count is a typo: OpenMP would abort allocating the pool)
MAX_THREADS = 1024
#: layers at most (a larger count is a typo: building 10^6 layers takes the better part of an hour)
MAX_LAYERS = 1024
#: hidden channels and heads at most: a layer's weight is [hidden x heads, in]; beyond 2^63 torch's sizes overflow
#: (a TypeError traceback instead of the out-of-memory line that a merely too large model gets)
MAX_HIDDEN = 2**40
MAX_HEADS = 2**16
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: --device (g3mpi.train.device: which GPU a rank takes) and --cuda-aware (device buffers straight to MPI)
DEVICES = ("cpu", "cuda", "auto")
CUDA_AWARE = ("auto", "on", "off")


class ConfigError(ValueError):
    """A bad configuration value or file (the message names it). ``key``: the setting at fault, if one is."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class TrainConfig:
    parts: str = ""                 # partition directory (meta.json + part files)
    out: str = ""                   # run directory to create
    model: str = "gcn"              # gcn | sage | gat
    layers: int = 2
    hidden: int = 16                # hidden channels (per head for GAT)
    heads: int = 8                  # GAT heads in hidden layers (concatenated)
    out_heads: int = 1              # GAT heads in the last layer (averaged)
    dropout: float = 0.5            # on every layer's input
    attn_dropout: float = 0.0       # GAT attention coefficients
    activation: str = "relu"
    optimizer: str = "adam"
    lr: float = 0.01
    weight_decay: float = 5e-4
    momentum: float = 0.0           # SGD only
    epochs: int = 200
    eval_every: int = 1             # evaluate (train/val/test accuracy) every k epochs and after the last
    patience: int = 0               # stop after this many evaluations without a better validation accuracy (0: never)
    seed: int = 0
    threads: int = 1                # torch threads per rank
    device: str = "cpu"             # cpu | cuda | auto (cuda where every rank sees a GPU, else cpu)
    cuda_aware: str = "auto"        # CUDA device buffers straight to MPI: auto (where MPI reports support) | on | off
    oversubscribe_gpus: bool = False  # let the ranks of a node share its GPUs when they outnumber them
    schedule: str = PIPELINED       # one of sched.MODES (nocomm: timing only, results invalid on P > 1)
    chunk_rows: int = 0             # rows per aggregation chunk (0: from the feature width; <0: no chunking)
    sim_net: str = ""               # simulated network BANDWIDTH,LATENCY, e.g. "10Gbit,20us" ("" = off)
    input_cache: bool = True        # compute the first layer's aggregation of the constant input once (GNN)
    release_memory: bool = False    # freed memory back to the system at once: lower peak RSS, slower epochs
    verify: bool = True             # check part-file checksums on load
    progress: bool = True           # tqdm line on rank 0
    plots: bool = True              # RUN/training.png and RUN/ranks.png at the end (python -m g3mpi.cli.plots redraws)
    timeline_epoch: int = 2         # record this epoch's per-rank timeline: RUN/timeline.json (+ .png with plots);
                                    # the last epoch if the run has fewer, 0: off
    log_level: str = "INFO"
    force: bool = False             # replace an existing run directory
    checkpoint_every: int = 0       # write RUN/checkpoint.pt every k epochs (0: only at the end)
    comm_timeout: float = 0.0       # abort when a rank waits longer than this on another rank, seconds (0: off)
    time_limit: float = 0.0         # stop, with a checkpoint, at the first epoch end this many seconds after the
                                    # start (as on a stop signal; 0: none); saved as 0 in RUN/config.toml
    init_from: str = ""             # start from these parameters (a run's model.pt) instead of the seeded
                                    # initialisation ("" = none); with epochs = 0 the run only evaluates them

    def __post_init__(self):
        def bad(key, msg):
            raise ConfigError(msg, key)
        for k, allowed in (("model", MODELS), ("activation", ACTIVATIONS), ("optimizer", OPTIMIZERS),
                           ("schedule", MODES), ("log_level", LOG_LEVELS), ("device", DEVICES),
                           ("cuda_aware", CUDA_AWARE)):
            if (getattr(self, k).upper() if k == "log_level" else getattr(self, k)) not in allowed:
                bad(k, f"{k} {getattr(self, k)!r}: expected one of {', '.join(allowed)}")
        for k in ("layers", "hidden", "heads", "out_heads", "epochs", "eval_every", "threads"):
            if getattr(self, k) < 1 and not (k == "epochs" and self.epochs == 0 and self.init_from):
                only = "; 0 only with init_from (--init-from), to evaluate a trained model" if k == "epochs" else ""
                bad(k, f"{k} must be at least 1 (got {getattr(self, k)}){only}")
        if self.threads > MAX_THREADS:
            bad("threads", f"threads must be at most {MAX_THREADS} per rank (got {self.threads})")
        if self.layers > MAX_LAYERS:
            bad("layers", f"layers must be at most {MAX_LAYERS} (got {self.layers})")
        for k, most in (("hidden", MAX_HIDDEN), ("heads", MAX_HEADS), ("out_heads", MAX_HEADS)):
            if getattr(self, k) > most:
                bad(k, f"{k} must be at most {most} (got {getattr(self, k)})")
        # TOML and argparse: any int
        for k in ("epochs", "eval_every", "patience", "chunk_rows", "checkpoint_every", "timeline_epoch"):
            if not -2**63 <= getattr(self, k) < 2**63:
                bad(k, f"{k} must fit in 64 bits (got {getattr(self, k)})")
        for k in ("patience", "checkpoint_every", "timeline_epoch"):
            if getattr(self, k) < 0:
                bad(k, f"{k} must not be negative (got {getattr(self, k)})")
        if not 0 <= self.seed < 2**63:
            bad("seed", f"seed must be in [0, 2**63) (got {self.seed})")
        if not (math.isfinite(self.time_limit) and self.time_limit >= 0):
            bad("time_limit", f"time_limit must be a finite non-negative number of seconds (got {self.time_limit})")
        if not (math.isfinite(self.comm_timeout) and self.comm_timeout >= 0):
            bad("comm_timeout",
                f"comm_timeout must be a finite non-negative number of seconds (got {self.comm_timeout})")
        for k in ("dropout", "attn_dropout"):
            v = getattr(self, k)
            if not 0.0 <= v < 1.0:
                bad(k, f"{k} must be in [0, 1) (got {v})")
        for k in ("lr", "weight_decay", "momentum"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                bad(k, f"{k} must be a finite non-negative number (got {v})")
        if self.sim_net:
            from g3mpi.comm import parse_sim_net
            try:
                parse_sim_net(self.sim_net)
            except ValueError as e:
                bad("sim_net", str(e))

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)


def _coerce(name: str, typ, value, source: str):
    t = {"str": str, "int": int, "float": float, "bool": bool}[typ if isinstance(typ, str) else typ.__name__]
    if t is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{source}: {name} must be true or false (got {value!r})")
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if t is int and isinstance(value, bool) or not isinstance(value, t):
        raise ConfigError(f"{source}: {name} must be of type {t.__name__} (got {value!r})")
    return value


@dataclass(frozen=True)
class Given:
    """Where the user gave a setting: in the TOML file ``file``, under the key as written there (``name``), or on
    the command line (``file`` None, ``name`` the setting's name)."""
    file: str | None
    name: str

    def show(self, value) -> str:
        """The setting as the user gave it: ``run.toml: momentum = 0.9`` or ``command line: --momentum 0.9``."""
        if self.file is not None:
            return f"{self.file}: {self.name} = {_toml_value(value)}"
        opt = self.name.replace("_", "-")
        if isinstance(value, bool):
            return f"command line: --{'' if value else 'no-'}{opt}"
        return f"command line: --{opt} {value}"


def config_from(toml_path: str | None = None, overrides: dict | None = None) -> TrainConfig:
    """Defaults <- TOML file <- overrides (keys as in TrainConfig; None values are ignored)."""
    return config_and_origins(toml_path, overrides)[0]


def config_and_origins(toml_path: str | None = None,
                       overrides: dict | None = None) -> tuple[TrainConfig, dict[str, Given]]:
    """:func:`config_from`, and where each setting that the TOML file or the overrides give was given (a
    :class:`Given` per key; an override hides the file's value)."""
    types = {f.name: f.type for f in fields(TrainConfig)}
    values, source = {}, {}
    if toml_path:
        p = Path(toml_path)
        if not p.exists():
            raise ConfigError(f"{p}: no such config file")
        if not p.is_file():   # (a FIFO would block the read)
            raise ConfigError(f"{p}: is a {'directory' if p.is_dir() else 'special file'}, not a config file")
        try:
            text = p.read_text(encoding="utf-8-sig")   # a BOM (some editors) is fine
        except OSError as e:   # no permission, an I/O error
            raise ConfigError(f"{p}: cannot be read: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as e:   # (arrays nested too deep)
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        for k, v in data.items():
            key = k.replace("-", "_")
            if key not in types:
                raise ConfigError(f"{p}: unknown key {k!r}{did_you_mean(key, types)}")
            if key in values:
                raise ConfigError(f"{p}: {key} is given twice (as {source[key]!r} and {k!r})")
            values[key], source[key] = _coerce(key, types[key], v, str(p)), k
    for k, v in (overrides or {}).items():
        if v is not None:
            values[k], source[k] = _coerce(k, types[k], v, "command line"), None
    try:
        cfg = TrainConfig(**values)
    except ConfigError as e:  # name where the bad value came from
        if e.key in source:
            where = f"--{e.key.replace('_', '-')}" if source[e.key] is None else str(toml_path)
            raise ConfigError(f"{where}: {e}", e.key) from None
        raise
    except TypeError as e:
        raise ConfigError(str(e)) from None
    return cfg, {k: Given(None, k) if name is None else Given(str(toml_path), name) for k, name in source.items()}


def ineffective_settings(cfg: TrainConfig, given: dict[str, Given], *, world_size: int, resuming: bool = False,
                         input_cache_applies: bool = True, saved: dict | None = None) -> list[str]:
    """One line for each setting in ``given`` (:func:`config_and_origins`) whose value is not its default (with
    ``saved``, a resumed run's settings as its checkpoint records them: or not the saved value) but has no effect
    on this run, saying where it was given and why (the run goes on; its results are those without it).
    ``world_size``: the number of ranks; ``resuming``: the run continues from a checkpoint; ``input_cache_applies``:
    the model's first layer has a parameter-free product of the input to keep (``GNN.input_cache_applies``)."""
    why = settings_without_effect(cfg, world_size=world_size, resuming=resuming,
                                  input_cache_applies=input_cache_applies)

    def changed(f) -> bool:
        value = getattr(cfg, f.name)
        return value != f.default or (saved is not None and saved.get(f.name, f.default) != value)
    return [f"{given[f.name].show(getattr(cfg, f.name))} has no effect: {why[f.name]}"
            for f in fields(cfg) if f.name in why and f.name in given and changed(f)]


def settings_without_effect(cfg: TrainConfig, *, world_size: int, resuming: bool,
                            input_cache_applies: bool = True) -> dict[str, str]:
    """Why each setting that has no effect with these others, on ``world_size`` ranks, has none (by key): the
    warnings of :func:`ineffective_settings`, and the settings a resumed run may change (``checkpoint.RESUME_KEYS``
    that are idle here). ``input_cache_applies`` decides only ``input_cache``'s entry."""
    from g3mpi.nn.model import LAYERS   # (torch: imported by the runs that ask, not by the settings)
    why = {}
    layer = LAYERS[cfg.model]   # what the model's layers have: attention heads, row chunks
    if cfg.optimizer != "sgd":
        why["momentum"] = f"the optimizer is {cfg.optimizer}, and momentum is SGD's (optimizer sgd)"
    if not layer.attention:
        why["heads"] = why["out_heads"] = f"the model is {cfg.model}, and attention heads are GAT's"
        why["attn_dropout"] = f"the model is {cfg.model}, and attention dropout is GAT's"
    elif cfg.layers == 1:
        why["heads"] = "with one layer there is no hidden layer (the last layer has out_heads heads)"
    if cfg.layers == 1:
        why["activation"] = "with one layer there is no hidden layer (the last layer has no activation)"
    if not layer.rowwise:
        why["chunk_rows"] = "GAT computes its attention without row chunks (GCN and SAGE chunk their products)"
    elif Schedule.chunk_rows_idle(cfg.chunk_rows, cfg.schedule, world_size):
        why["chunk_rows"] = Schedule.chunk_rows_idle(cfg.chunk_rows, cfg.schedule, world_size)
    if world_size == 1:
        why["schedule"] = "one rank has no halo to exchange: every schedule computes the same way"
        why["sim_net"] = "one rank sends no messages"
        why["comm_timeout"] = "one rank waits for no other"
    elif not Schedule(cfg.schedule).communicates:
        why["sim_net"] = "the nocomm schedule sends no messages"
    if cfg.device == "cpu":
        why["cuda_aware"] = why["oversubscribe_gpus"] = "the device is cpu (--device cuda or auto uses GPUs)"
    if not input_cache_applies:
        why["input_cache"] = "there is no parameter-free product of the input to keep: " + (
            "GAT's first layer weighs its input before it aggregates" if layer.attention else
            "the first layer has more input features than outputs, so it multiplies by its weight before it aggregates")
    # (an evaluation-only run, epochs 0, saves them for a --resume that trains)
    if cfg.epochs and cfg.checkpoint_every >= cfg.epochs:
        why["checkpoint_every"] = f"the run ends at epoch {cfg.epochs}, where the checkpoint is written anyway"
    # the earliest early stop: patience evaluations after the earliest best, the first evaluation (epoch 0's of
    # init_from's parameters, else epoch eval_every's); one at the last epoch or later stops nothing
    first = 0 if cfg.init_from else cfg.eval_every
    soonest = first + cfg.patience * cfg.eval_every
    if cfg.epochs and not resuming and cfg.patience and soonest >= cfg.epochs:
        why["patience"] = (f"the run could stop at epoch {soonest} at the soonest (the best at epoch {first}, then "
                           f"{cfg.patience} evaluation{'' if cfg.patience == 1 else 's'} every {cfg.eval_every} "
                           f"epoch{'' if cfg.eval_every == 1 else 's'}), not before its last epoch {cfg.epochs}")
    if (cfg.init_from or resuming) and not (cfg.dropout > 0 or layer.attention and cfg.attn_dropout > 0):
        why["seed"] = (f"the parameters come from {'the checkpoint' if resuming else 'init_from'} and no dropout "
                       "is drawn")
    if resuming:
        why["force"] = "a resumed run continues in its run directory: nothing is replaced"
    return why


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    # a TOML basic string: backslash, quote and every control character escaped (\uXXXX), the rest as is
    s = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7f else "\\" + c if c in '\\"' else c
                for c in str(v))
    return f'"{s}"'


def to_toml(cfg: TrainConfig) -> str:
    lines = ["# g3-train resolved configuration (rerun with --config this-file)"]
    lines += [f"{f.name} = {_toml_value(getattr(cfg, f.name))}" for f in fields(cfg)]
    return "\n".join(lines) + "\n"
