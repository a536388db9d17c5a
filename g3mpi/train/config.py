"""Training configuration: one frozen dataclass, read from TOML (stdlib ``tomllib``) plus overrides, saved back
as TOML (``RUN/config.toml``) so a run can be repeated with ``--config RUN/config.toml``. Imports no torch:
g3-train reads and checks its settings, and prints its --help, before it imports torch."""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from g3mpi.mpi.deadline import ADAPTIVE, AUTO, DEFAULT_FACTOR, DEFAULT_FLOOR_S, parse_timeout
from g3mpi.nn import specs
from g3mpi.options import did_you_mean
from g3mpi.sched import MODES, PIPELINED, Schedule

from .choices import DECODERS, METRICS, TASKS, metric_misfit

#: the built-in models (the registry's, g3mpi.nn.specs, torch-free); the names of g3mpi.nn's activations, norms and
#: jumping knowledge modes, here without torch, so that the settings and g3-train --help import none
#: (tests/test_train_config.py checks that they are g3mpi.nn's)
MODELS = specs.names()
ACTIVATIONS = ("relu", "elu", "gelu", "leaky_relu", "tanh")
NORMS = ("none", "layer", "batch")
JKS = ("none", "cat", "max")
OPTIMIZERS = ("adam", "sgd")
#: torch threads per rank at most (a larger count is a typo: OpenMP would abort allocating the pool)
MAX_THREADS = 1024
#: layers (and steps) at most, and heads at most: the registry's (``specs``)
MAX_LAYERS, MAX_HEADS = specs.MAX_LAYERS, specs.MAX_HEADS
#: hidden channels at most: a layer's weight is [hidden x heads, in]; beyond 2^63 torch's sizes overflow (a
#: TypeError traceback instead of the out-of-memory line that a merely too large model gets)
MAX_HIDDEN = 2**40
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: --device (g3mpi.train.device: which GPU a rank takes) and --cuda-aware (device buffers straight to MPI)
DEVICES = ("cpu", "cuda", "auto")
CUDA_AWARE = ("auto", "on", "off")
PROGRESS = ("auto", "on", "off")
#: --remat: cheap, the default (the row-wise blocks between two aggregations are recomputed in backward from the
#: aggregate: g3mpi.ops.remat; GAT's per-edge attention terms: g3mpi.ops.gat) | none (autograd keeps what each op
#: saves). Stacks that cannot recompute (appnp, gcn2, the recipe stack) keep what they save whatever it says.
REMATS = ("none", "cheap")
#: --precision (g3mpi.ops.precision): fp32, exact (the default) | bf16-mixed; --halo-dtype: what halo rows and
#: their gradients travel as (g3mpi.comm.codec), independently of --precision
PRECISIONS = ("fp32", "bf16-mixed")
HALO_DTYPES = ("float32", "bfloat16", "float16")


class ConfigError(ValueError):
    """A bad configuration value or file (the message names it). ``key``: the setting at fault, if one is."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


#: the built-in models' own settings (heads, k, alpha, theta, ...): fields of the registry's (``specs.SETTINGS``),
#: so that a model's entry brings its settings; TrainConfig's first fields
ModelSettings = dataclasses.make_dataclass(
    "ModelSettings", [(s.name, s.type, dataclasses.field(default=s.default)) for s in specs.SETTINGS.values()],
    frozen=True)


@dataclass(frozen=True)
class TrainConfig(ModelSettings):
    parts: str = ""                 # partition directory (meta.json + part files)
    out: str = ""                   # run directory to create
    model: str = "gcn"              # a built-in model of the registry (g3mpi.nn.specs: gcn, sage, gat, ...)
    model_file: str = ""            # PATH.py:FUNCTION: a user's model instead of the built-in one (docs/MODELS.md)
    layers: int = 2
    hidden: int = 16                # hidden channels (per head for GAT)
    node_embedding: int = 0         # a learned input row of this width per node, held by its owner, before the
                                    # features if the graph has any (0: none; g3mpi.nn.embedding)
    dropout: float = 0.5            # on every layer's input
    activation: str = "relu"
    # recipe blocks (gcn, sage, gat; docs/RECIPES.md)
    residual: bool = False          # add each hidden layer's input to its output (where the widths agree)
    norm: str = "none"              # none | layer | batch, after each hidden layer (batch: over every node)
    input_linear: bool = False      # a Linear in -> hidden before the first layer
    output_linear: bool = False     # a Linear hidden -> out after the last layer (always with jk)
    ffn: bool = False               # a feed-forward block (Linear, activation, Linear) after each hidden layer
    jk: str = "none"                # jumping knowledge over the hidden layers: none | cat | max
    task: str = "multiclass"        # multiclass | binary | multilabel | link (g3mpi.train.tasks, .link)
    metric: str = "accuracy"        # accuracy | roc_auc | ap | f1_macro | mrr | hits@K: reported first, selects
                                    # the best epoch
    decoder: str = "dot"            # link: dot | hadamard (an MLP of hidden width on the product), g3mpi.nn.link
    embed_dim: int = 64             # link: the width of the node embeddings the encoder outputs
    negatives: int = 1              # link: negatives sampled per training pair and epoch (without fixed ones)
    optimizer: str = "adam"
    lr: float = 0.01
    weight_decay: float = 5e-4
    momentum: float = 0.0           # SGD only
    epochs: int = 200
    eval_every: int = 1             # evaluate (train/val/test metrics) every k epochs and after the last
    patience: int = 0               # stop after this many evaluations without a better validation metric (0: never)
    seed: int = 0
    threads: int = 1                # torch threads per rank
    device: str = "cpu"             # cpu | cuda | auto (cuda where every rank sees a GPU, else cpu)
    cuda_aware: str = "auto"        # CUDA device buffers straight to MPI: auto (where MPI reports support) | on | off
    oversubscribe_gpus: bool = False  # let the ranks of a node share its GPUs when they outnumber them
    schedule: str = PIPELINED       # one of sched.MODES (nocomm: timing only, results invalid on P > 1)
    chunk_rows: int = 0             # rows per aggregation chunk (0: from the feature width; <0: no chunking)
    sim_net: str = ""               # simulated network BANDWIDTH,LATENCY, e.g. "10Gbit,20us" ("" = off)
    precision: str = "fp32"         # fp32 (exact) | bf16-mixed: bf16 products and activations, fp32 weights/reductions
    halo_dtype: str = "float32"     # float32 | bfloat16 | float16 (scaled per message): halo messages on the wire
    input_cache: bool = True        # compute the first layer's aggregation of the constant input once (GNN)
    remat: str = "cheap"            # cheap | none: recompute the row-wise blocks (GAT: per-edge terms) in backward
    release_memory: bool = False    # freed memory back to the system at once: lower peak RSS, slower epochs
    verify: bool = True             # check part-file checksums on load
    progress: str = "auto"          # rank 0's tqdm line: auto (when stderr is a terminal) | on | off
    plots: bool = True              # RUN/training.png and RUN/ranks.png at the end (python -m g3mpi.cli.plots redraws)
    timeline_epoch: int = 2         # record this epoch's per-rank timeline: RUN/timeline.json (+ .png with plots);
                                    # the last epoch if the run has fewer, 0: off
    log_level: str = "INFO"
    force: bool = False             # replace an existing run directory
    checkpoint_every: int = 0       # write RUN/checkpoint.pt every k epochs (0: only at the end)
    comm_timeout: float = ADAPTIVE  # end the job when a rank waits longer than this on another rank, seconds
                                    # (0: off; -1, "auto": adaptive, max(floor, factor x the slowest epoch))
    comm_timeout_floor: float = DEFAULT_FLOOR_S   # the adaptive deadline's floor, seconds
    comm_timeout_factor: float = DEFAULT_FACTOR   # the adaptive deadline's multiple of the slowest epoch
    time_limit: float = 0.0         # stop, with a checkpoint, at the first epoch end this many seconds after the
                                    # start (as on a stop signal; 0: none); saved as 0 in RUN/config.toml
    init_from: str = ""             # start from these parameters (a run's model.pt) instead of the seeded
                                    # initialisation ("" = none); with epochs = 0 the run only evaluates them
    debug: bool = False             # an error's line is followed by its traceback
    model_file_sha256: str = ""     # the model file must have this SHA-256 ("" = any); RUN/config.toml records
                                    # the file's, so --resume refuses an edited one
    allow_changed_model: bool = False   # --resume with a model file changed since (saved as off)

    def __post_init__(self):
        def bad(key, msg):
            raise ConfigError(msg, key)
        if isinstance(self.progress, bool):   # --progress / --no-progress, progress = true in TOML: forced
            object.__setattr__(self, "progress", "on" if self.progress else "off")
        for k, allowed in (("model", MODELS), ("activation", ACTIVATIONS), ("optimizer", OPTIMIZERS),
                           ("schedule", MODES), ("log_level", LOG_LEVELS), ("device", DEVICES),
                           ("cuda_aware", CUDA_AWARE), ("progress", PROGRESS), ("remat", REMATS),
                           ("precision", PRECISIONS),
                           ("halo_dtype", HALO_DTYPES), ("norm", NORMS), ("jk", JKS), ("task", TASKS),
                           ("metric", METRICS), ("decoder", DECODERS)):
            if (getattr(self, k).upper() if k == "log_level" else getattr(self, k)) not in allowed:
                bad(k, f"{k} {getattr(self, k)!r}: expected one of {', '.join(allowed)}")
        if self.precision != "fp32" and self.device == "cuda":   # (auto on GPUs: the forward runs in fp32)
            bad("precision", f"precision {self.precision} runs on CPU ranks only (device cpu; got {self.device})")
        if metric_misfit(self.task, self.metric):
            bad("metric", metric_misfit(self.task, self.metric))
        for s in specs.SETTINGS.values():     # each model setting's range, as its entry states it
            if s.problem(getattr(self, s.name)):
                bad(s.name, s.problem(getattr(self, s.name)))
        for k in ("layers", "hidden", "epochs", "eval_every", "threads", "embed_dim", "negatives"):
            if getattr(self, k) < 1 and not (k == "epochs" and self.epochs == 0 and self.init_from):
                only = "; 0 only with init_from (--init-from), to evaluate a trained model" if k == "epochs" else ""
                bad(k, f"{k} must be at least 1 (got {getattr(self, k)}){only}")
        if self.threads > MAX_THREADS:
            bad("threads", f"threads must be at most {MAX_THREADS} per rank (got {self.threads})")
        if self.layers > MAX_LAYERS:
            bad("layers", f"layers must be at most {MAX_LAYERS} (got {self.layers})")
        if self.node_embedding < 0:
            bad("node_embedding", f"node_embedding must not be negative (got {self.node_embedding}; 0: none)")
        for k, most in (("hidden", MAX_HIDDEN), ("embed_dim", MAX_HIDDEN), ("node_embedding", MAX_HIDDEN),
                        ("negatives", MAX_HEADS)):
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
        if not (math.isfinite(self.comm_timeout) and (self.comm_timeout >= 0 or self.comm_timeout == ADAPTIVE)):
            bad("comm_timeout", f"comm_timeout must be {AUTO!r} (or {ADAPTIVE:g}) or a finite non-negative number of "
                                f"seconds (got {self.comm_timeout})")
        for k in ("comm_timeout_floor", "comm_timeout_factor"):
            if not (math.isfinite(getattr(self, k)) and getattr(self, k) > 0):
                bad(k, f"{k} must be a finite positive number (got {getattr(self, k)})")
        if not 0.0 <= self.dropout < 1.0:
            bad("dropout", f"dropout must be in [0, 1) (got {self.dropout})")
        for k in ("lr", "weight_decay", "momentum"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                bad(k, f"{k} must be a finite non-negative number (got {v})")
        if self.model_file:
            path, _, func = self.model_file.rpartition(":")
            if not path or not func.isidentifier():
                bad("model_file", f"model_file {self.model_file!r}: expected PATH.py:FUNCTION (the file and the "
                                  "function in it that builds the model)")
        if self.sim_net:
            from g3mpi.comm import parse_sim_net
            try:
                parse_sim_net(self.sim_net)
            except ValueError as e:
                bad("sim_net", str(e))

    @property
    def model_label(self) -> str:
        """The model as outputs name it: the built-in's name, or the user's ``PATH.py:FUNCTION``."""
        return self.model_file or self.model

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)


def _coerce(name: str, typ, value, source: str):
    if name == "comm_timeout" and isinstance(value, str):   # "auto", or seconds as text (the command line)
        try:
            return parse_timeout(value)
        except ValueError as e:
            raise ConfigError(f"{source}: comm_timeout: {e}", name) from None
    if name == "progress" and isinstance(value, bool):   # forced on or off (a TOML bool, --[no-]progress)
        return "on" if value else "off"
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
    the model's first layer has a parameter-free product of the input to keep (``specs.input_cache_applies``)."""
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
    warnings of :func:`ineffective_settings`, and the settings a resumed run may change (``checkpoint.resume_keys``
    that are idle here). ``input_cache_applies`` decides only ``input_cache``'s entry."""
    why = {}
    model = specs.spec(cfg.model)   # what the model has: attention heads, row chunks, an input cache
    recipe = specs.uses_recipe(cfg)
    if cfg.optimizer != "sgd":
        why["momentum"] = f"the optimizer is {cfg.optimizer}, and momentum is SGD's (optimizer sgd)"
    if cfg.model_file:
        # the user's function gets the whole configuration: only the choice of a built-in is known to be idle
        why["model"] = f"the model comes from model_file {cfg.model_file}"
    elif not model.attention:
        attending = "/".join(specs.MODELS[m].title for m in specs.readers("heads"))
        why["heads"] = why["out_heads"] = f"the model is {cfg.model}, and attention heads are {attending}'s"
        why["attn_dropout"] = f"the model is {cfg.model}, and attention dropout is {attending}'s"
    elif cfg.layers == 1 and not (cfg.output_linear or cfg.jk != "none"):
        why["heads"] = "with one layer there is no hidden layer (the last layer has out_heads heads)"
    if cfg.layers == 1 and not cfg.model_file and not recipe and not model.activation_with_one_layer:
        why["activation"] = "with one layer there is no hidden layer (the last layer has no activation)"
    if not cfg.model_file:
        why.update(_recipe_without_effect(cfg))
    if model.attention and not cfg.model_file:   # (the row-wise models chunk their products)
        why["chunk_rows"] = (f"{model.title} computes its attention without row chunks (GCN and SAGE chunk their "
                             "products)")
    elif Schedule.chunk_rows_idle(cfg.chunk_rows, cfg.schedule, world_size):
        why["chunk_rows"] = Schedule.chunk_rows_idle(cfg.chunk_rows, cfg.schedule, world_size)
    if world_size == 1:
        why["schedule"] = "one rank has no halo to exchange: every schedule computes the same way"
        why["sim_net"] = "one rank sends no messages"
        why["comm_timeout"] = why["comm_timeout_floor"] = why["comm_timeout_factor"] = "one rank waits for no other"
        why["halo_dtype"] = "one rank sends no halo messages"
    elif cfg.comm_timeout >= 0:
        why["comm_timeout_floor"] = why["comm_timeout_factor"] = (
            f"comm_timeout {cfg.comm_timeout:g} is a fixed deadline{' (off)' if not cfg.comm_timeout else ''}: the "
            "floor and factor shape the adaptive one (comm_timeout auto)")
    elif not Schedule(cfg.schedule).communicates:
        why["sim_net"] = "the nocomm schedule sends no messages"
    if cfg.task != "link":
        why["decoder"] = why["embed_dim"] = why["negatives"] = f"the task is {cfg.task}, and node pairs are link's"
    if cfg.device == "cpu":
        why["cuda_aware"] = why["oversubscribe_gpus"] = "the device is cpu (--device cuda or auto uses GPUs)"
    if not input_cache_applies and cfg.model_file:
        why["input_cache"] = "it is the built-in models' cache (a model file's module keeps what it wants)"
    elif not input_cache_applies:
        why["input_cache"] = "there is no parameter-free product of the input to keep: " + (
            f"the {cfg.model} model does not keep one" if not model.recipe else
            "the recipe stack (docs/RECIPES.md) does not keep one" if recipe else
            f"{model.title}'s first layer weighs its input before it aggregates" if not model.input_cache else
            "the first layer has more input features than outputs, so it multiplies by its weight before it aggregates")
    if cfg.remat != "none" and not cfg.model_file and (not model.remat or recipe):
        plain = ", ".join(s.title for s in specs.MODELS.values() if s.remat)
        why["remat"] = f"only the plain {_and(plain)} stacks recompute what they keep for backward: " + (
            "the recipe stack (docs/RECIPES.md) keeps it" if model.remat else f"the {cfg.model} model keeps it")
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
    if (cfg.init_from or resuming) and not cfg.model_file and \
            not (cfg.dropout > 0 or model.uses("attn_dropout") and cfg.attn_dropout > 0):
        why["seed"] = (f"the parameters come from {'the checkpoint' if resuming else 'init_from'} and no dropout "
                       "is drawn")
    if resuming:
        why["force"] = "a resumed run continues in its run directory: nothing is replaced"
    return why


def _recipe_without_effect(cfg: TrainConfig) -> dict[str, str]:
    """Why each recipe block or model setting (``specs.SETTINGS``) has no effect with this model (by key)."""
    why = {}
    model = specs.spec(cfg.model)
    if not model.recipe:
        stacks = _and(", ".join(m for m, s in specs.MODELS.items() if s.recipe), "'s")
        for k in ("residual", "norm", "input_linear", "output_linear", "ffn", "jk"):
            why[k] = f"the {cfg.model} model has its own stack (recipe blocks are {stacks})"
    for k in specs.SETTINGS:
        if not model.uses(k) and k not in specs.ATTENTION_SETTINGS:   # (those: below)
            why[k] = f"the model is {cfg.model}, and {k}{_SETTING_GLOSS.get(k, '')} is " \
                f"{_and(', '.join(specs.readers(k)), chr(39) + 's')}"
    if cfg.jk != "none" and "output_linear" not in why:
        why["output_linear"] = f"jk {cfg.jk} always ends with an output linear layer"
    return why


#: how the messages of :func:`_recipe_without_effect` name a setting
_SETTING_GLOSS = {"k": " (propagation steps)", "theta": " (identity mapping)"}


def _and(names: str, suffix: str = "") -> str:
    """"a, b, c" -> "a's, b's and c's" (``suffix`` "'s"): a list in a message."""
    parts = [p + suffix for p in names.split(", ") if p]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


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


def _saved(name: str, value):
    """A setting as RUN/config.toml writes it: the adaptive deadline as "auto", as the user spells it."""
    return AUTO if name == "comm_timeout" and value == ADAPTIVE else value


def to_toml(cfg: TrainConfig) -> str:
    lines = ["# g3-train resolved configuration (rerun with --config this-file)"]
    lines += [f"{f.name} = {_toml_value(_saved(f.name, getattr(cfg, f.name)))}" for f in fields(cfg)]
    return "\n".join(lines) + "\n"
