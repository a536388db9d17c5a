"""g3-train: distributed full-graph GNN training, one rank per partition part.

    mpiexec -n P g3-train --parts PARTS --out RUN [--config run.toml] [--model gcn|sage|gat] [...]
    mpiexec -n P g3-train --parts PARTS --out RUN --model-file PATH.py:FUNCTION [...]   (your own model)
    mpiexec -n P python -m mpi4py -m g3mpi.cli.train --parts PARTS --out RUN [...]
    mpiexec -n P g3-train --resume RUN [--epochs N] [...]      (continue from RUN/checkpoint.pt)

Settings come from the defaults, then ``--config`` (TOML, keys as the long options with underscores), then
the command line. The resolved configuration is saved as RUN/config.toml. Errors are reported once for the job,
by rank 0, one line per distinct error naming the ranks that had it (``g3-train: error: [ranks 0-3] ...``), and
every rank exits non-zero. SIGTERM or SIGUSR1 stops every rank after the
current epoch with RUN/checkpoint.pt written and exit status 75 (:mod:`g3mpi.mpi.stop`).
"""
from __future__ import annotations

import argparse
import sys

from g3mpi.options import Parser

PROG = "g3-train"
#: how long a rank whose command line or configuration is bad waits for the others at the configuration check
#: (they may be slow to start on a busy node) before it ends the job alone, with its line
CONFIG_CHECK_TIMEOUT_S = 60.0


class BadCommandLine(Exception):
    """A command line argparse refused; the text is its one line, without the program and rank."""


class _Parser(Parser):
    """The g3 commands' parser, but a bad command line is one line naming the rank, as every other error of
    g3-train (``g3-train: error: [rank r] argument --epochs: invalid int value: 'ten' ...``), not the usage on
    every rank: :class:`BadCommandLine`, which :func:`main` reports after the ranks' configuration check."""

    def error(self, message: str):
        raise BadCommandLine(self.error_line(message))


def build_parser() -> argparse.ArgumentParser:
    """g3-train's options (a bad command line raises :class:`BadCommandLine`)."""
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", help="partition directory (meta.json + part-*.h5)")
    ap.add_argument("--out", help="run directory to create")
    ap.add_argument("--config", help="TOML file with settings (command-line options override it)")
    ap.add_argument("--resume", metavar="RUN",
                    help="continue the run in RUN from RUN/checkpoint.pt, with RUN/config.toml as the settings "
                         "(with --parts OTHER: on another partition of the same graph, any number of ranks)")
    ap.add_argument("--check", nargs="?", type=int, const=0, metavar="P",
                    help="run the start-up checks only, then exit (0: they pass): under mpiexec every one the "
                         "ranks make (settings, part files, halo lists, model, checkpoint); with P, on one "
                         "process, those that read no part's data for a job of P ranks (what the job scripts "
                         "check before they launch)")
    _model_options(ap.add_argument_group("model"))
    _model_settings(ap.add_argument_group("the models' own settings"))
    _recipe_options(ap.add_argument_group("recipe blocks (gcn, sage, gat; docs/RECIPES.md)"))
    _optimisation_options(ap.add_argument_group("optimisation"))
    _runtime_options(ap.add_argument_group("runtime"))
    _reliability_options(ap.add_argument_group("reliability"))
    _name_defaults(ap)
    return ap


def _model_options(g) -> None:
    from g3mpi.train.config import ACTIVATIONS, MODELS
    g.add_argument("--model", choices=MODELS, help="a built-in model (its settings: the models' own settings)")
    g.add_argument("--model-file", metavar="PATH.py:FUNCTION",
                   help="a model of your own instead of --model: FUNCTION(graph, in_dim, out_dim, cfg) in PATH.py "
                        "returns a torch.nn.Module whose forward(x, key) gives [owned nodes, out_dim] "
                        "(docs/MODELS.md)")
    g.add_argument("--node-embedding", type=int, metavar="DIM",
                   help="learn a DIM-wide input row per node (held by the rank that owns it), for graphs without "
                        "features; with features the model's input is [embedding | features] (0: none)")
    g.add_argument("--layers", type=int)
    g.add_argument("--hidden", type=int, help="hidden channels (per head for GAT)")
    g.add_argument("--dropout", type=float, help="dropout on every layer's input")
    g.add_argument("--activation", help=f"one of {', '.join(ACTIVATIONS)}")
    g.add_argument("--init-from", metavar="MODEL_PT",
                   help="start from these parameters (a run's model.pt; same model, features and classes) instead "
                        "of the seeded initialisation; with --epochs 0 only evaluate them (accuracies, "
                        "predictions.h5), on any partition of any graph")


def _model_settings(g) -> None:
    """An option per setting of the model registry (``g3mpi.nn.specs.SETTINGS``), its help naming the models."""
    from g3mpi.nn import specs
    for s in specs.SETTINGS.values():
        g.add_argument(f"--{s.name.replace('_', '-')}", type=s.type,
                       help=f"{', '.join(specs.readers(s.name))}: {s.help}")


def _recipe_options(g) -> None:
    from g3mpi.train.config import JKS, NORMS
    onoff = argparse.BooleanOptionalAction
    g.add_argument("--residual", action=onoff, help="add each hidden layer's input to its output (equal widths)")
    g.add_argument("--norm", choices=NORMS, help="after each hidden layer: LayerNorm, or BatchNorm over all nodes")
    g.add_argument("--input-linear", action=onoff, help="a Linear layer (features -> hidden) before the first")
    g.add_argument("--output-linear", action=onoff, help="a Linear layer (hidden -> classes) after the last")
    g.add_argument("--ffn", action=onoff, help="a feed-forward block after each hidden layer's propagation")
    g.add_argument("--jk", choices=JKS, help="jumping knowledge: concatenate or take the maximum of the hidden "
                                             "layers' outputs (with an output linear layer)")


def _optimisation_options(g) -> None:
    from g3mpi.train.config import DECODERS, METRICS, OPTIMIZERS, TASKS
    g.add_argument("--task", choices=TASKS,
                   help="multiclass (softmax cross-entropy), binary (labels 0/1, one logit, BCE), multilabel "
                        "(labels [N, C] of 0/1, BCE per column) or link (node pairs of the graph's link splits: "
                        "the model's output embeds nodes, --decoder scores pairs, BCE over positives and negatives)")
    g.add_argument("--metric", choices=METRICS,
                   help="what the summary reports first and the best epoch and --patience go by (roc_auc and ap: "
                        "binary and multilabel tasks; mrr and hits@K: the link task)")
    g.add_argument("--decoder", choices=DECODERS,
                   help="link: how a pair is scored from its two embeddings: dot (inner product) or hadamard (an "
                        "MLP of --hidden width on their product)")
    g.add_argument("--embed-dim", type=int, help="link: the width of the node embeddings (the model's output)")
    g.add_argument("--negatives", type=int,
                   help="link: negatives sampled per training pair and epoch (when the split has no fixed ones)")
    g.add_argument("--optimizer", choices=OPTIMIZERS)
    g.add_argument("--lr", type=float)
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--momentum", type=float, help="SGD momentum (--optimizer sgd; adam does not use it)")
    g.add_argument("--epochs", type=int)
    g.add_argument("--eval-every", type=int)
    g.add_argument("--patience", type=int, help="early stopping: evaluations without improvement (0: off)")
    g.add_argument("--seed", type=int)


def _runtime_options(g) -> None:
    from g3mpi.train.config import CUDA_AWARE, DEVICES, HALO_DTYPES, LOG_LEVELS, MODES, PRECISIONS, REMATS
    g.add_argument("--threads", type=int, help="torch threads per rank")
    g.add_argument("--device", choices=DEVICES,
                   help="where each rank computes: cpu, cuda (a rank takes the GPU of its index among the ranks "
                        "of its node) or auto (cuda where every rank sees a GPU, else cpu)")
    g.add_argument("--cuda-aware", choices=CUDA_AWARE,
                   help="with --device cuda, hand device buffers straight to MPI (auto: where the MPI reports "
                        "CUDA support; off: stage messages through host memory)")
    g.add_argument("--schedule", choices=MODES)
    g.add_argument("--chunk-rows", type=int, help="rows per aggregation chunk (0: automatic, <0: no chunks)")
    g.add_argument("--sim-net", help="simulated network BANDWIDTH,LATENCY, e.g. 10Gbit,20us")
    g.add_argument("--precision", choices=PRECISIONS,
                   help="default fp32 (exact); bf16-mixed: dense products and stored activations in bfloat16, "
                        "weights, optimiser, reductions and the gradient allreduce in float32 (docs/RUNTIME.md)")
    g.add_argument("--halo-dtype", choices=HALO_DTYPES,
                   help="what halo rows and their gradients travel as: default float32; bfloat16, or float16 "
                        "with a per-message scale (half the bytes)")
    # on/off settings: both forms, so that the command line can undo a --config file's choice either way
    onoff = argparse.BooleanOptionalAction
    g.add_argument("--release-memory", action=onoff,
                   help="return freed memory to the system at once (lower peak RSS; slower epochs where page "
                        "faults are expensive; default off)")
    g.add_argument("--input-cache", action=onoff,
                   help="keep the first layer's aggregation of the input between passes (default on; off: "
                        "recompute it in every pass)")
    g.add_argument("--remat", choices=REMATS,
                   help="default cheap: keep only each aggregation's output for backward and compute the "
                        "activation, dropout and weight products after it again there, by row chunks (GCN, SAGE "
                        "and GAT stacks, user models that ask), GAT's per-edge attention terms likewise (about "
                        "half the memory); none: keep what autograd saves")
    g.add_argument("--verify", action=onoff, help="check part-file checksums on load (default on)")
    g.add_argument("--progress", action=onoff, help="a progress bar on rank 0 (default auto: when stderr is a "
                        "terminal, not into a batch job's log; --progress forces it)")
    g.add_argument("--plots", action=onoff,
                   help="RUN/training.png and RUN/ranks.png at the end (default on; python -m g3mpi.cli.plots RUN "
                        "draws them)")
    g.add_argument("--timeline-epoch", type=int, metavar="E",
                   help="record epoch E's per-rank timeline (compute, sends, waits per layer): RUN/timeline.json, "
                        "and RUN/timeline.png with plots (default 2, or the last epoch of a shorter run; 0: off)")
    g.add_argument("--oversubscribe-gpus", action=onoff,
                   help="with --device cuda, let the ranks of a node share its GPUs when they outnumber them "
                        "(rank r takes GPU r mod the GPU count)")
    g.add_argument("--log-level", help=f"one of {', '.join(LOG_LEVELS)} (any case)")
    g.add_argument("--force", action=onoff,
                   help="replace an existing run directory (default off; saved as off in RUN/config.toml)")


def _reliability_options(g) -> None:
    g.add_argument("--checkpoint-every", type=int, metavar="K",
                   help="write RUN/checkpoint.pt every K epochs (always at the end)")
    g.add_argument("--time-limit", type=float, metavar="S",
                   help="stop after the first epoch that ends S seconds after the start, with RUN/checkpoint.pt "
                        "and exit status 75, as on SIGTERM (0: none; the job launchers set it from G3_TIMEOUT)")
    g.add_argument("--comm-timeout", metavar="S|auto",
                   help="end the job (exit status 69) when a rank waits more than S seconds for another rank: "
                        "start-up checks, training, writing the outputs (0: off; default auto: before the first "
                        "epochs the largest part's size / 4 MiB/s, then the slowest epoch x --comm-timeout-factor, "
                        "never under --comm-timeout-floor)")
    g.add_argument("--comm-timeout-floor", type=float, metavar="S",
                   help="the adaptive deadline's floor, seconds")
    g.add_argument("--comm-timeout-factor", type=float, metavar="K",
                   help="the adaptive deadline's multiple of the slowest epoch")
    g.add_argument("--debug", action=argparse.BooleanOptionalAction,
                   help="follow an error's line with its traceback (default off)")
    g.add_argument("--model-file-sha256", metavar="HEX",
                   help="refuse a --model-file whose SHA-256 is not this (RUN/config.toml records the file's, so "
                        "that --resume refuses an edited one; default off)")
    g.add_argument("--allow-changed-model", action=argparse.BooleanOptionalAction,
                   help="--resume even if the model file changed since the run started (default off: refused)")


def _name_defaults(ap: argparse.ArgumentParser) -> None:
    """Append TrainConfig's default to the help of every setting whose help does not state it yet (the parser
    leaves options not given as None: the defaults live in TrainConfig, and RUNTIME.md lists them)."""
    from dataclasses import fields

    from g3mpi.train.config import TrainConfig
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    for a in ap._actions:
        d = defaults.get(a.dest)
        if a.dest in ("parts", "out", "init_from") or d is None or "default" in (a.help or ""):
            continue
        if isinstance(d, bool):
            shown = "on" if d else "off"
        else:
            shown = f"{d:g}" if isinstance(d, float) else d if d != "" else "off"
        a.help = f"{a.help} (default {shown})" if a.help else f"default {shown}"


def config_check(comm, err: str | None, timeout: float, own_world: bool) -> bool:
    """Every rank's first collective, once it has read its command line and configuration (``err``: why it could
    not, or None): True if every rank could. Else rank 0 has written the job's lines (one per distinct error,
    naming its ranks) and, on its own COMM_WORLD, every rank finalized MPI, so that no rank's exit cuts a line off
    (under ``python -m mpi4py`` a non-zero exit with MPI initialised aborts the job); the caller then exits with
    status 2. A rank that failed waits at most CONFIG_CHECK_TIMEOUT_S for the others (they may be slow to start
    on a busy node), then writes its own line and ends the job alone; one that did not waits as at the other
    start-up checks (``timeout``: --comm-timeout). Needs no torch: a bad configuration ends the job before any
    rank imports it."""
    from g3mpi.mpi.abort import wait_stderr_read, write_line
    from g3mpi.mpi.watchdog import Watchdog
    from g3mpi.mpi.report import report
    prog = PROG
    line = f"{prog}: error: [rank {comm.rank}] {err}"

    def alone(code):   # the others never came: this rank's own line too, after the watchdog's, then the abort
        write_line(line)
        wait_stderr_read()
        comm.Abort(code)
    # every rank polls non-blocking collectives, deadline or not (a blocking collective matches no non-blocking
    # one, and the failed ranks' must be non-blocking to have theirs)
    wd = (Watchdog(comm, CONFIG_CHECK_TIMEOUT_S, prog=prog, limit="the configuration check's limit", code=2,
                   abort=alone) if err else Watchdog(comm, timeout if timeout > 0 else float("inf"), prog=prog))
    errs = wd.allgather_text(err, "configuration check")
    if not any(e is not None for e in errs):
        return True
    report(comm.rank, prog, errs)
    if own_world:
        wd.barrier("configuration check (rank 0's lines are out before the job ends)")
        from mpi4py import MPI
        MPI.Finalize()
    return False


def settings(args: dict):
    """(TrainConfig, where each setting was given, the run directory to resume or None) from the parsed command
    line ``args`` (consumed): defaults <- ``--config`` or RUN/config.toml (``--resume``) <- the options given;
    ConfigError when they do not make a run."""
    from g3mpi.train.config import ConfigError, config_and_origins
    resume = args.pop("resume")
    toml = args.pop("config")
    # an empty path (an unset shell variable: --config "$CFG") would read as no option at all: the defaults,
    # a new run, the seeded initialisation
    for opt, value in (("config", toml), ("resume", resume), ("init-from", args.get("init_from"))):
        if value == "":
            raise ConfigError(f"--{opt}: the path is empty")
    if resume:
        if toml:
            raise ConfigError("--resume takes its settings from RUN/config.toml: give either --config or --resume")
        if args.get("out") and args["out"] != resume:
            raise ConfigError("--resume continues in RUN itself: --out must be omitted")
        if args.get("init_from"):
            raise ConfigError("--resume continues from RUN/checkpoint.pt: --init-from starts a new run")
        toml, args["out"] = f"{resume}/config.toml", resume
    cfg, given = config_and_origins(toml, args)
    if resume:   # RUN/config.toml is g3-train's record of the run, not the user's choice
        given = {k: g for k, g in given.items() if g.file is None}
    if not cfg.parts:
        raise ConfigError("no partition directory given (--parts)")
    if not cfg.out:
        raise ConfigError("no run directory given (--out)")
    if cfg.model_file:
        _check_model_file(cfg, resume)
    return cfg, given, resume


def _check_model_file(cfg, resume: str | None) -> None:
    """The model file exists (said before any part is read), and has the SHA-256 ``model_file_sha256`` if that
    is set (on ``--resume``: the file the run started with, whose SHA-256 RUN/config.toml records), unless
    ``allow_changed_model``."""
    from pathlib import Path

    from g3mpi.format.checksums import file_sha256
    from g3mpi.train.config import ConfigError
    path = Path(cfg.model_file.rpartition(":")[0])
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such file"
        raise ConfigError(f"{path}: {what} (--model-file takes PATH.py:FUNCTION)", "model_file")
    if cfg.model_file_sha256 and not cfg.allow_changed_model and file_sha256(path) != cfg.model_file_sha256:
        if resume:
            raise ConfigError(f"{path}: the model file changed since the run in {resume} started (its SHA-256 "
                              f"differs from model_file_sha256 in {resume}/config.toml); restore it, or resume "
                              "with --allow-changed-model", "model_file")
        raise ConfigError(f"{path}: its SHA-256 is not model_file_sha256 {cfg.model_file_sha256} (or give "
                          "--allow-changed-model)", "model_file")


def main(argv=None, comm=None) -> int:
    """Run g3-train on ``comm`` (default COMM_WORLD, the program's own). Returns the exit status: 0, 1 (errors),
    2 (bad configuration) or 75 (stopped by a signal after writing the checkpoint). As the program itself (the
    command line from ``sys.argv``, its own COMM_WORLD) it does not return: :func:`exit_now`."""
    code = _main(argv, comm)
    if argv is None and comm is None:
        exit_now(code)
    return code


def exit_now(code: int) -> None:
    """End the process with ``code`` once every output is written: MPI finalized (a clean exit, no ``MPI_Abort``
    from ``python -m mpi4py``), the streams flushed, then the C library's ``exit``. Python's own teardown of torch,
    matplotlib and the rest took seconds after the run's last line (9 s of a 31 s one-epoch run on a busy 2-core
    node). Not ``os._exit``: MPICH 5 tells its launcher that a rank finished in a C ``atexit`` handler, and a rank
    that skips it looks crashed, so Hydra killed the ranks still finalizing (exit 9 after a complete run)."""
    import ctypes
    import logging

    if "mpi4py.MPI" in sys.modules:   # (--check P ran without MPI: importing it now would start it)
        from mpi4py import MPI
        if not MPI.Is_finalized():
            MPI.Finalize()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).exit(code)


def _main(argv, comm) -> int:
    from g3mpi.train.phases import Phases   # (no torch)
    phases = Phases.since_process_start()   # where the start-up goes: summary.json's "startup"
    phases.mark("interpreter")
    own_world = comm is None
    # the command line first: it needs neither MPI nor torch, so --help is out in a fraction of a second (MPI_Init
    # alone takes a quarter of one, torch seconds on a busy node); a bad one is reported at the configuration check
    try:
        args, bad = vars(build_parser().parse_args(argv)), None
    except BadCommandLine as e:
        args, bad = None, str(e)
    phases.mark("command line")
    check = args.pop("check") if args is not None else _check_asked(sys.argv[1:] if argv is None else argv)
    if check:   # (no MPI: the job scripts run it before they launch anything)
        return _check_alone(args, bad, check)
    if own_world:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    phases.mark("mpi init")
    from g3mpi.mpi.stop import StopSignals   # no torch

    # SIGTERM / SIGUSR1 (a batch job's time limit, scancel, kill) stop the run after an epoch with a checkpoint.
    # Active from here, not only around training: MPICH's MPI_Init installs a SIGUSR1 handler of its own, which
    # would swallow a stop request that arrives during start-up (the job then ran on until SIGKILL); a request
    # recorded before training stops it after its first epoch. Before torch is imported: that import is most of a
    # rank's start-up (seconds, far more on a busy node), and a signal there was swallowed.
    with StopSignals() as stop:
        if bad is not None:
            config_check(comm, bad, 0.0, own_world)
            return 2
        from g3mpi.train.config import ConfigError
        try:
            cfg, given, resume = settings(args)
        except ConfigError as e:
            config_check(comm, str(e), 0.0, own_world)
            return 2
        if not config_check(comm, None, cfg.comm_timeout, own_world):
            return 2
        phases.mark("configuration check")
        from g3mpi.train.rundir import RunLock   # torch and the runtime
        from g3mpi.train.run import run
        phases.mark("imports")
        with RunLock() as lock:   # rank 0 takes it when it prepares the run directory
            code = run(comm, cfg, given, resume, stop=stop, lock=lock, own_world=own_world, prog=PROG,
                       phases=phases, check=check is not None)
        if code and own_world:
            from mpi4py import MPI
            if not MPI.Is_finalized():
                # an exit the ranks agreed on, the job's lines out: without this, a non-zero exit under
                # `python -m mpi4py` calls MPI_Abort, and the launcher adds a line of noise per rank
                MPI.Finalize()
        return code


def _check_asked(argv) -> int | None:
    """``--check P``'s P in a command line the parser refused (its one line then comes from the check, alone)."""
    words = [str(w) for w in argv]
    for i, w in enumerate(words):
        value = w.split("=", 1)[1] if w.startswith("--check=") else words[i + 1] if w == "--check" and \
            i + 1 < len(words) else None
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _check_alone(args: dict | None, bad: str | None, ranks: int) -> int:
    """``g3-train --check P``: the settings, then :func:`g3mpi.train.startup.check_job` for a job of ``ranks``
    ranks; one line and the exit status (0 passed, 2 bad settings, 1 a check failed)."""
    from g3mpi.train.config import ConfigError
    code, err = 2, bad
    if err is None:
        try:
            cfg, _, resume = settings(args)
        except ConfigError as e:
            err = str(e)
        else:
            from g3mpi.train.startup import check_job
            code, err = 1, check_job(cfg, resume, ranks)
    if err is not None:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return code
    print(f"{PROG}: check passed: {cfg.parts} for {ranks} {'rank' if ranks == 1 else 'ranks'}, run directory "
          f"{cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
