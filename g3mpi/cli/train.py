"""g3-train: distributed full-graph GNN training, one rank per partition part.

    mpiexec -n P g3-train --parts PARTS --out RUN [--config run.toml] [--model gcn|sage|gat] [...]
    mpiexec -n P python -m mpi4py -m g3mpi.cli.train --parts PARTS --out RUN [...]
    mpiexec -n P g3-train --resume RUN [--epochs N] [...]      (continue from RUN/checkpoint.pt)

Settings come from the defaults, then ``--config`` (TOML, keys as the long options with underscores), then
the command line. The resolved configuration is saved as RUN/config.toml. Errors are reported on every rank
(``g3-train: error: [rank r] ...``) and every rank exits non-zero. SIGTERM or SIGUSR1 stops every rank after the
current epoch with RUN/checkpoint.pt written and exit status 75 (:mod:`g3mpi.train.stop`).
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from mpi4py import MPI

from g3mpi.comm.abort import abort_job, write_line

PROG = "g3-train"
#: how long a rank whose command line or configuration is bad waits for the others at the configuration check
#: (they may still be importing torch on a busy node) before it ends the job alone, its line already out
CONFIG_CHECK_TIMEOUT_S = 60.0


class BadCommandLine(Exception):
    """A command line argparse refused; the text is its one line, without the program and rank."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line naming the rank, as every other error of g3-train
    (``g3-train: error: [rank r] argument --epochs: invalid int value: 'ten' ...``), not the usage on every rank:
    :class:`BadCommandLine`, which :func:`main` reports after the ranks' configuration check."""

    def error(self, message: str):
        raise BadCommandLine(f"{message} ({self.prog} --help lists the options)")


def build_parser() -> argparse.ArgumentParser:
    """g3-train's options (a bad command line raises :class:`BadCommandLine`)."""
    from g3mpi.train.config import ACTIVATIONS, LOG_LEVELS, MODELS, MODES, OPTIMIZERS   # the choices' one home
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", help="partition directory (meta.json + part-*.h5)")
    ap.add_argument("--out", help="run directory to create")
    ap.add_argument("--config", help="TOML file with settings (command-line options override it)")
    ap.add_argument("--resume", metavar="RUN",
                    help="continue the run in RUN from RUN/checkpoint.pt, with RUN/config.toml as the settings "
                         "(with --parts OTHER: on another partition of the same graph, any number of ranks)")
    g = ap.add_argument_group("model")
    g.add_argument("--model", choices=MODELS)
    g.add_argument("--layers", type=int)
    g.add_argument("--hidden", type=int, help="hidden channels (per head for GAT)")
    g.add_argument("--heads", type=int, help="GAT heads in hidden layers")
    g.add_argument("--out-heads", type=int, help="GAT heads in the last layer (averaged)")
    g.add_argument("--dropout", type=float, help="dropout on every layer's input")
    g.add_argument("--attn-dropout", type=float, help="GAT attention dropout")
    g.add_argument("--activation", help=f"one of {', '.join(ACTIVATIONS)}")
    g.add_argument("--init-from", metavar="MODEL_PT",
                   help="start from these parameters (a run's model.pt; same model, features and classes) instead "
                        "of the seeded initialisation; with --epochs 0 only evaluate them (accuracies, "
                        "predictions.h5), on any partition of any graph")
    g = ap.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=OPTIMIZERS)
    g.add_argument("--lr", type=float)
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--momentum", type=float, help="SGD momentum (--optimizer sgd; adam does not use it)")
    g.add_argument("--epochs", type=int)
    g.add_argument("--eval-every", type=int)
    g.add_argument("--patience", type=int, help="early stopping: evaluations without improvement (0: off)")
    g.add_argument("--seed", type=int)
    g = ap.add_argument_group("runtime")
    g.add_argument("--threads", type=int, help="torch threads per rank")
    g.add_argument("--schedule", choices=MODES)
    g.add_argument("--chunk-rows", type=int, help="rows per aggregation chunk (0: automatic, <0: no chunks)")
    g.add_argument("--sim-net", help="simulated network BANDWIDTH,LATENCY, e.g. 10Gbit,20us")
    # on/off settings: both forms, so that the command line can undo a --config file's choice either way
    onoff = argparse.BooleanOptionalAction
    g.add_argument("--release-memory", action=onoff,
                   help="return freed memory to the system at once (lower peak RSS; slower epochs where page "
                        "faults are expensive; default off)")
    g.add_argument("--input-cache", action=onoff,
                   help="keep the first layer's aggregation of the input between passes (default on; off: "
                        "recompute it in every pass)")
    g.add_argument("--verify", action=onoff, help="check part-file checksums on load (default on)")
    g.add_argument("--progress", action=onoff, help="a progress bar on rank 0 (default on)")
    g.add_argument("--plots", action=onoff,
                   help="RUN/training.png and RUN/ranks.png at the end (default on; python -m g3mpi.cli.plots RUN "
                        "draws them)")
    g.add_argument("--timeline-epoch", type=int, metavar="E",
                   help="record epoch E's per-rank timeline (compute, sends, waits per layer): RUN/timeline.json, "
                        "and RUN/timeline.png with plots (default 2, or the last epoch of a shorter run; 0: off)")
    g.add_argument("--log-level", help=f"one of {', '.join(LOG_LEVELS)} (any case)")
    g.add_argument("--force", action=onoff,
                   help="replace an existing run directory (default off; saved as off in RUN/config.toml)")
    g = ap.add_argument_group("reliability")
    g.add_argument("--checkpoint-every", type=int, metavar="K",
                   help="write RUN/checkpoint.pt every K epochs (always at the end)")
    g.add_argument("--time-limit", type=float, metavar="S",
                   help="stop after the first epoch that ends S seconds after the start, with RUN/checkpoint.pt "
                        "and exit status 75, as on SIGTERM (0: none; the job launchers set it from G3_TIMEOUT)")
    g.add_argument("--comm-timeout", type=float, metavar="S",
                   help="abort the job when a rank waits more than S seconds for another rank: start-up checks, "
                        "training, writing the predictions (0: off)")
    _name_defaults(ap)
    return ap


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


def _model_args(cfg) -> str:
    """The settings that shape the model's parameters, as options (for messages)."""
    heads = f" --heads {cfg.heads} --out-heads {cfg.out_heads}" if cfg.model == "gat" else ""
    return f"--model {cfg.model} --layers {cfg.layers} --hidden {cfg.hidden}{heads}"


def _failure(what: str, e: BaseException, cfg, part) -> str:
    """The line for an unexpected failure while ``what`` ran: for memory that could not be allocated (torch says
    so in a RuntimeError) what was asked for and of which model, else the traceback."""
    text = str(e).strip().splitlines()[-1] if str(e).strip() else ""
    if isinstance(e, MemoryError) or "can't allocate memory" in text:
        return (f"{what} ran out of memory ({_model_args(cfg)}, {part.num_classes} classes, {part.num_owned} "
                f"owned and {part.num_halo} halo nodes of {part.feature_dim} features on this rank): "
                f"{type(e).__name__}: {text}")
    return f"{what} failed:\n{traceback.format_exc()}"


def _line(comm, msg: str) -> str:
    return f"{PROG}: error: [rank {comm.rank}] {msg}"


def _error(comm, msg: str) -> None:
    write_line(_line(comm, msg))


def _agree(watchdog, err: str | None, what: str, check: str) -> bool:
    """Every rank learns whether any rank failed; each prints one line. True if all succeeded. The waits are the
    ``watchdog``'s (with ``--comm-timeout``, a rank that never arrives ends the job naming the start-up ``check``)."""
    comm = watchdog.comm
    errs = watchdog.allgather_text(err, f"start-up check {check!r}")
    if not any(errs):
        return True
    if err:
        _error(comm, err)
    else:
        _error(comm, f"stopping: rank(s) {[r for r, e in enumerate(errs) if e]} {what}")
    # every line is out before any rank exits (under `python -m mpi4py` the first non-zero exit aborts the rest)
    watchdog.barrier(f"start-up check {check!r} (every rank's line is out before the job ends)")
    return False


def _config_check(comm, err: str | None, timeout: float, own_world: bool) -> bool:
    """Every rank's first collective, once it has read its command line and configuration (``err``: why it could
    not, or None): True if every rank could. Else every rank has printed one line, its own error or which ranks
    failed, and on its own COMM_WORLD finalized MPI, so that no rank's exit cuts another's line off (under
    ``python -m mpi4py`` the first non-zero exit aborts the job); the caller then exits with status 2. A rank that
    failed waits at most CONFIG_CHECK_TIMEOUT_S for the others, then ends the job alone; one that did not waits as
    at the other start-up checks (``timeout``: --comm-timeout)."""
    import numpy as np

    from g3mpi.comm.watchdog import Watchdog
    if err:
        _error(comm, err)   # first: the line stands whatever the other ranks do
    failed = np.zeros(comm.size, dtype=np.uint8)
    req = comm.Iallgather(np.array([err is not None], dtype=np.uint8), failed)
    wd = (Watchdog(comm, CONFIG_CHECK_TIMEOUT_S, prog=PROG, limit="the configuration check's limit", code=2) if err
          else Watchdog(comm, timeout, prog=PROG))
    wd.wait_collective([req], "configuration check")
    if not failed.any():
        return True
    if not err:
        ranks = np.flatnonzero(failed).tolist()
        _error(comm, f"stopping: rank(s) {ranks} could not read the command line or the configuration")
    if own_world:
        MPI.Finalize()
    return False


def main(argv=None, comm=None) -> int:
    """Run g3-train on ``comm`` (default COMM_WORLD, the program's own). Returns the exit status: 0, 1 (errors),
    2 (bad configuration) or 75 (stopped by a signal after writing the checkpoint)."""
    own_world = comm is None
    comm = comm or MPI.COMM_WORLD
    from g3mpi.train.stop import StopSignals   # no torch (g3mpi.train imports its modules on first use)

    # SIGTERM / SIGUSR1 (a batch job's time limit, scancel, kill) stop the run after an epoch with a checkpoint.
    # Active from here, not only around training: MPICH's MPI_Init installs a SIGUSR1 handler of its own, which
    # would swallow a stop request that arrives during start-up (the job then ran on until SIGKILL); a request
    # recorded before training stops it after its first epoch. Before the parser too, which imports torch: that
    # import is most of a rank's start-up (seconds, far more on a busy node), and a signal there was swallowed.
    with StopSignals() as stop:
        try:
            args = vars(build_parser().parse_args(argv))
        except BadCommandLine as e:
            _config_check(comm, str(e), 0.0, own_world)
            return 2
        from g3mpi.train.rundir import RunLock
        with RunLock() as lock:   # rank 0 takes it when it prepares the run directory
            return _run(comm, args, own_world, stop, lock)


def _run(comm, args: dict, own_world: bool, stop, lock) -> int:
    """g3-train after its arguments are parsed, with ``stop`` (a StopSignals) active; returns the exit status.
    ``lock``: the run directory's :class:`~g3mpi.train.rundir.RunLock`, released when the caller's block ends
    (here, before a failure ends the job)."""
    from g3mpi.comm.consistency import check_neighbours
    from g3mpi.comm.watchdog import Watchdog
    from g3mpi.format import FormatError, part_name, read_meta, read_part
    from g3mpi.log import node_name, setup_logging
    from g3mpi.train import ConfigError, Trainer, prepare_run_dir
    from g3mpi.train.checkpoint import (CHECKPOINT_NAME, CheckpointError, check_compatible, check_restorable,
                                        load_checkpoint, load_model_state, state_mismatch)
    from g3mpi.train.config import config_and_origins, ineffective_settings, settings_without_effect
    from g3mpi.train.faults import TestHooks, TrainingFault
    from g3mpi.train.rundir import OutputError
    from g3mpi.train.stop import EXIT_STOPPED
    from g3mpi.train.trainer import IDS_NOT_ONCE, start_up_sums

    resume = args.pop("resume")
    try:
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
    except ConfigError as e:
        _config_check(comm, str(e), 0.0, own_world)
        return 2
    if not _config_check(comm, None, cfg.comm_timeout, own_world):
        return 2
    log = setup_logging(comm, cfg.log_level)
    stop.stop_after(cfg.time_limit)
    # every wait from here on has the --comm-timeout deadline (none with 0: the plain blocking calls)
    watchdog = Watchdog(comm, cfg.comm_timeout, prog=PROG)

    if cfg.release_memory:
        from g3mpi.train.trainer import return_freed_memory
        return_freed_memory()   # before the part is loaded (the Trainer sets it too)

    # every rank loads its own part; failures anywhere are agreed on before any exchange starts
    err, part, meta, hooks = None, None, None, None
    try:
        hooks = TestHooks.from_env(comm.rank)
        meta = read_meta(cfg.parts)
        if meta["num_parts"] != comm.size:
            raise FormatError(f"{cfg.parts}/meta.json",
                              f"the partition has {meta['num_parts']} parts but {comm.size} "
                              f"{'rank was' if comm.size == 1 else 'ranks were'} started "
                              f"(run with mpiexec -n {meta['num_parts']})")
        part = read_part(cfg.parts, comm.rank, meta, verify=cfg.verify)
    except FormatError as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - any load failure must reach every rank
        err = f"{type(e).__name__}: {e}"
    if not _agree(watchdog, err, "failed to load their part", "part files"):
        return 1
    hooks.stall_at("startup")
    # halo/send consistency with every neighbour (a pairwise exchange of counts and ID checksums)
    try:
        err = check_neighbours(comm, part, name_of=part_name, watchdog=watchdog)
        err = err and f"{cfg.parts.rstrip('/')}/{part_name(comm.rank)}: {err}"
    except Exception:  # noqa: BLE001 - failed inside its collectives: the others may wait there, so no _agree
        abort_job(comm, _line(comm, "checking the halo against the neighbours failed:\n" + traceback.format_exc()))
        return 1
    if not _agree(watchdog, err, "found their halo inconsistent with a neighbour", "halo lists"):
        return 1
    split_sizes, ids_once = start_up_sums(part, watchdog)
    # (every rank has the same sums, so every rank says the same line and none waits for another)
    err = None if ids_once else f"{cfg.parts}: {IDS_NOT_ONCE}"
    if not split_sizes["train"]:  # before the run directory is made: nothing to train on
        err = err or (f"{cfg.parts}: the graph has no training nodes (no labels, or an empty train mask; "
                      "g3-prepare edgelist takes them with --labels and --masks)")
    if err:
        _error(comm, err)
        watchdog.barrier("start-up check 'split sizes' (every rank's line is out before the job ends)")
        return 1
    ckpt = None
    if resume:
        try:
            ckpt = load_checkpoint(f"{resume}/{CHECKPOINT_NAME}")
            check_compatible(f"{resume}/{CHECKPOINT_NAME}", ckpt, cfg, meta,
                             finished=Path(resume, "summary.json").exists(),
                             idle=settings_without_effect(cfg, world_size=comm.size, resuming=True))
        except CheckpointError as e:
            err = str(e)
        if not _agree(watchdog, err, "could not resume from the checkpoint", "checkpoint"):
            return 1
    init = None
    if cfg.init_from and not resume:   # (a resumed run's parameters come from its checkpoint)
        err = None
        try:
            init = load_model_state(cfg.init_from)
        except CheckpointError as e:
            err = str(e)
        if not _agree(watchdog, err, "could not read the initial model", "initial model"):
            return 1
    log.info("part %d on node %s: %d owned, %d halo, %d local edges; model %s", part.part_id, node_name(),
             part.num_owned, part.num_halo, int(part.indptr[-1]), cfg.model)
    # the model is built before the run directory is made, so that parameters that do not fit it leave no run
    try:
        trainer = Trainer(cfg, comm, part, meta, stop=stop, watchdog=watchdog, hooks=hooks, split_sizes=split_sizes)
    except Exception as e:  # noqa: BLE001 - one failing rank must not leave the others waiting
        abort_job(comm, _line(comm, _failure("setting up training", e, cfg, part)))
        return 1
    if ckpt is not None:   # states that do not fit the model (every rank holds the same checkpoint)
        err = None
        try:
            check_restorable(f"{resume}/{CHECKPOINT_NAME}", ckpt, trainer.model, trainer.opt)
        except CheckpointError as e:
            err = str(e)
        if not _agree(watchdog, err, "could not resume from the checkpoint", "checkpoint"):
            trainer.close()
            return 1
    if init is not None:
        why = state_mismatch(init, trainer.model.state_dict())
        err = why and (f"{cfg.init_from}: its parameters do not fit this model ({_model_args(cfg)}, "
                       f"{part.feature_dim} features, {part.num_classes} classes): {why}")
        if not _agree(watchdog, err, "could not start from the initial model", "initial model"):
            trainer.close()
            return 1
        trainer.start_from(init)
    if comm.rank == 0:   # settings the user gave that change nothing here: one line each, and the run goes on
        for line in ineffective_settings(cfg, given, world_size=comm.size, resuming=bool(resume),
                                         input_cache_applies=trainer.model.input_cache_applies,
                                         saved=ckpt["config"] if ckpt else None):
            log.warning("%s", line)
    run_dir, err = prepare_run_dir(comm, cfg, resume_epoch=ckpt["epoch"] if ckpt else None,
                                   resume_eval_every=ckpt["config"].get("eval_every") if ckpt else None,
                                   watchdog=watchdog, lock=lock)
    if err:
        _error(comm, err)
        trainer.close()
        return 1
    try:
        if ckpt is not None:
            trainer.restore(ckpt)
            log.info("resuming from %s at epoch %d", run_dir / CHECKPOINT_NAME, ckpt["epoch"])
            was = ckpt["partition"]
            if was["partition_id"] != meta["partition_id"] and comm.rank == 0:
                log.info("the checkpoint was trained on another partition of the same graph (%s, %d parts); "
                         "continuing on %s (%s, %d parts)", was["method"], was["num_parts"], cfg.parts,
                         meta.get("method", "?"), meta["num_parts"])
        elif init is not None:
            log.info("starting from the parameters in %s", cfg.init_from)
        summary = trainer.fit(run_dir)
        trainer.close()
    except TrainingFault as e:  # raised on every rank together: a clean, coordinated exit
        _error(comm, str(e))
        watchdog.barrier("exit after a training fault (every rank's line is out before the job ends)")
        return 1
    except OutputError as e:  # a file of the run directory (often on rank 0 alone): one line, end the job
        lock.release()   # (MPI_Abort ends the process before the caller could)
        abort_job(comm, _line(comm, str(e)))
        return 1
    except Exception as e:  # noqa: BLE001 - one failing rank must not leave the others waiting
        lock.release()
        abort_job(comm, _line(comm, _failure("training", e, cfg, part)))
        return 1
    if summary.get("stopped"):
        if comm.rank == 0:
            write_line(f"g3-train: stopped by {summary['reason']} after epoch {summary['epoch']} of {cfg.epochs}: "
                       f"{run_dir / CHECKPOINT_NAME} is written; continue with: mpiexec -n {comm.size} "
                       f"g3-train --resume {run_dir}")
        watchdog.barrier("exit after a stop signal (the checkpoint and the line are out before the job ends)")
        # the run is over on every rank. A stop signal from here on is srun ending the tasks that have not exited
        # yet because another one already exited with 75 (--kill-on-bad-exit): it must not turn 75 into 143
        stop.ignore_from_now()
        if own_world:
            # exit 75 on every rank, cleanly: under `python -m mpi4py` a non-zero exit with MPI still initialised
            # calls MPI_Abort, which srun reports as killed tasks (exit status 137) instead of 75
            MPI.Finalize()
        hooks.stall_at("exit")
        return EXIT_STOPPED
    if comm.rank == 0:
        def num(key):   # None (no such split, no trained epoch) as nan; 0.0 as itself
            return float("nan") if summary[key] is None else summary[key]
        if summary["epochs"] == 0:
            log.info("done: evaluated the parameters of %s: val %.4f, test %.4f -> %s", cfg.init_from, num("val_acc"),
                     num("test_acc"), run_dir)
        else:
            log.info("done: best epoch %s, val %.4f, test %.4f, median epoch %.4fs -> %s", summary["best_epoch"],
                     num("val_acc"), num("test_acc"), num("epoch_time_median_s"), run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
