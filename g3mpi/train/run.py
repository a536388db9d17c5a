"""One rank's g3-train run once every rank has read its settings: the start-up (:mod:`.startup`), the run
directory (:func:`.rundir.prepare_run_dir`), training (:meth:`.trainer.Trainer.fit`), and the exit status with
its lines: 0; 1 after an error (rank 0's lines for the job, :mod:`g3mpi.mpi.report`; every rank exits); 75
(``EXIT_STOPPED``) when a stop signal or the time limit stopped the run after its checkpoint was written; 69
(``EXIT_STALLED``) when a rank stopped answering (the communication deadline), or a stop signal could not be agreed
on with a stalled rank: the last checkpoint stays valid.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mpi4py import MPI

from g3mpi.mpi.abort import abort_job, write_line
from g3mpi.mpi.fail import fail_job
from g3mpi.mpi.watchdog import Watchdog
from g3mpi.log import setup_logging

from .checkpoint import CHECKPOINT_NAME
from .config import TrainConfig, ineffective_settings
from .faults import TrainingFault
from .choices import SUFFIX
from .phases import Phases
from .rundir import OutputError, RunLock, prepare_run_dir
from .startup import PROG, Protocol, Started, StartupFailed, failure, start
from g3mpi.mpi.stop import EXIT_STOPPED
from .sysmem import return_freed_memory
from .userfile import exits_guarded

log = logging.getLogger("g3mpi")


@dataclass(frozen=True)
class Finished:
    """What a finished run leaves besides its files: the summary (rank 0's; {} on the others), this rank's
    trained module (the best parameters) and the run directory."""
    summary: dict
    model: object
    run_dir: Path


def run(comm, cfg: TrainConfig, given: dict, resume: str | None, *, stop, lock: RunLock, own_world: bool,
        prog: str = PROG, phases: Phases | None = None, check: bool = False) -> int:
    """g3-train on ``comm`` after the configuration check: the exit status (:func:`execute`'s)."""
    return execute(comm, cfg, given, resume, stop=stop, lock=lock, own_world=own_world, prog=prog,
                   phases=phases, check=check)[0]


def execute(comm, cfg: TrainConfig, given: dict, resume: str | None, *, stop, lock: RunLock, own_world: bool,
            prog: str = PROG, phases: Phases | None = None, check: bool = False) -> tuple[int, Finished | None]:
    """:func:`_execute`, with ``os._exit`` from the model file's code raising :class:`~.userfile.UserExit` (a
    rank leaving early fails the job, with its line, instead of ending it as if it had finished)."""
    with exits_guarded():
        return _execute(comm, cfg, given, resume, stop=stop, lock=lock, own_world=own_world, prog=prog,
                        phases=phases, check=check)


def _execute(comm, cfg: TrainConfig, given: dict, resume: str | None, *, stop, lock: RunLock, own_world: bool,
             prog: str = PROG, phases: Phases | None = None, check: bool = False) -> tuple[int, Finished | None]:
    """g3-train on ``comm`` after the configuration check: the exit status, and the :class:`Finished` run where
    it finished or stopped (None after an error). ``given``: where the user gave
    each setting (``config.config_and_origins``); ``resume``: the run directory to continue, or None; ``stop``:
    the active :class:`~g3mpi.mpi.stop.StopSignals`; ``lock``: the run directory's lock, which the caller
    releases when its block ends (here, before an abort ends the job); ``own_world``: ``comm`` is the program's
    COMM_WORLD (then MPI is finalized before a stopped run exits 75); ``phases``: the start-up's so far (the
    command line's), which this one goes on marking for summary.json; ``check`` (``--check``): stop after the
    start-up's checks, 0 if they passed, before the run directory is made."""
    phases = phases or Phases()
    setup_logging(comm, cfg.log_level)
    stop.stop_after(cfg.time_limit)
    # every wait from here on has the --comm-timeout deadline (adaptive by default; none with 0: the plain
    # blocking calls), and a stop signal or a lost launcher ends a wait on peers that do not come
    proto = Protocol(Watchdog(comm, cfg.comm_timeout, prog=prog, stop=stop, floor=cfg.comm_timeout_floor,
                              factor=cfg.comm_timeout_factor), prog)
    if cfg.release_memory:
        return_freed_memory()   # before the part is loaded
    try:
        started = start(proto, cfg, stop, resume, phases)
    except StartupFailed as e:
        return e.code, None
    ckpt = started.ckpt
    if comm.rank == 0:   # settings the user gave that change nothing here: one line each, and the run goes on
        for line in ineffective_settings(cfg, given, world_size=comm.size, resuming=bool(resume),
                                         input_cache_applies=started.trainer.input_cache_applies,
                                         saved=ckpt["config"] if ckpt else None):
            log.warning("%s", line)
    if check:
        started.trainer.close()
        if comm.rank == 0:
            write_line(f"{prog}: check passed: {cfg.parts} on {comm.size} "
                       f"{'rank' if comm.size == 1 else 'ranks'}, model {cfg.model_label}, run directory {cfg.out}")
        return 0, None
    run_dir, err = prepare_run_dir(comm, cfg, resume_epoch=ckpt["epoch"] if ckpt else None,
                                   resume_eval_every=ckpt["config"].get("eval_every") if ckpt else None,
                                   watchdog=proto.watchdog, lock=lock)
    phases.mark("run directory")
    started.trainer.startup = phases
    if err:   # rank 0's (every rank has its word)
        started.trainer.close()
        try:
            proto.agree(err if comm.rank == 0 else None, "run directory")
        except StartupFailed as e:
            return e.code, None
    summary = _train(proto, cfg, started, run_dir, lock)
    if summary is None:
        return 1, None
    done = Finished(summary, started.trainer.model, run_dir)
    if summary.get("stopped"):
        return _stopped(proto, cfg, summary, run_dir, stop, started, own_world), done
    if comm.rank == 0:
        _say_done(cfg, summary, run_dir)
    return 0, done


def _train(proto: Protocol, cfg: TrainConfig, started: Started, run_dir: Path, lock: RunLock) -> dict | None:
    """The trainer restored (or started from the given parameters) and its run: :meth:`Trainer.fit`'s summary, or
    None after an error, when every rank has said its line or the job is being aborted."""
    comm, trainer, ckpt = proto.comm, started.trainer, started.ckpt
    try:
        if ckpt is not None:
            trainer.restore(ckpt)
            log.info("resuming from %s at epoch %d", run_dir / CHECKPOINT_NAME, ckpt["epoch"])
            was, meta = ckpt["partition"], started.meta
            if was["partition_id"] != meta["partition_id"] and comm.rank == 0:
                log.info("the checkpoint was trained on another partition of the same graph (%s, %d parts); "
                         "continuing on %s (%s, %d parts)", was["method"], was["num_parts"], cfg.parts,
                         meta.get("method", "?"), meta["num_parts"])
        elif started.init is not None:
            log.info("starting from the parameters in %s", cfg.init_from)
        summary = trainer.fit(run_dir)
        trainer.close()
    except TrainingFault as e:  # raised on every rank together: a clean, coordinated exit, the job's lines once
        try:
            proto.agree(str(e), "exit after a training fault")
        except StartupFailed:
            return None
    except OutputError as e:  # a file of the run directory (often on rank 0 alone): one line, end the job
        lock.release()   # (MPI_Abort ends the process before the caller could)
        abort_job(comm, proto.line(str(e)))
        return None
    except BaseException as e:  # noqa: BLE001 - one failing rank must not leave the others waiting
        # (a model file's error on some ranks, sys.exit and os._exit included: the others wait for this one in
        # an exchange; the failing ranks' lines come once, from the lowest of them, and the job ends)
        lock.release()
        fail_job(comm, proto.prog, failure("training", e, cfg, started.part, trainer.watchdog.context))
        return None
    return summary


def _stopped(proto: Protocol, cfg: TrainConfig, summary: dict, run_dir: Path, stop, started: Started,
             own_world: bool) -> int:
    """A run stopped by a signal or the time limit, its checkpoint written: rank 0's line, then exit 75 on every
    rank together."""
    comm = proto.comm
    if comm.rank == 0:
        write_line(f"g3-train: stopped by {summary['reason']} after epoch {summary['epoch']} of {cfg.epochs}: "
                   f"{run_dir / CHECKPOINT_NAME} is written; continue with: mpiexec -n {comm.size} "
                   f"g3-train --resume {run_dir}")
    proto.watchdog.barrier("exit after a stop signal (the checkpoint and the line are out before the job ends)")
    # the run is over on every rank. A stop signal from here on is srun ending the tasks that have not exited
    # yet because another one already exited with 75 (--kill-on-bad-exit): it must not turn 75 into 143
    stop.ignore_from_now()
    if own_world:
        # exit 75 on every rank, cleanly: under `python -m mpi4py` a non-zero exit with MPI still initialised
        # calls MPI_Abort, which srun reports as killed tasks (exit status 137) instead of 75
        MPI.Finalize()
    started.hooks.stall_at("exit")
    return EXIT_STOPPED


def _say_done(cfg: TrainConfig, summary: dict, run_dir: Path) -> None:
    """Rank 0's last line of a finished run."""
    def num(key):   # None (no such split, no trained epoch) as nan; 0.0 as itself
        return float("nan") if summary[key] is None else summary[key]
    m = SUFFIX[cfg.metric]   # the chosen metric (accuracy: "acc")
    if summary["epochs"] == 0:
        log.info("done: evaluated the parameters of %s: val %s %.4f, test %.4f -> %s", cfg.init_from, cfg.metric,
                 num(f"val_{m}"), num(f"test_{m}"), run_dir)
    else:
        log.info("done: best epoch %s, val %s %.4f, test %.4f, median epoch %.4fs -> %s", summary["best_epoch"],
                 cfg.metric, num(f"val_{m}"), num(f"test_{m}"), num("epoch_time_median_s"), run_dir)
