"""Training from Python: :func:`train` and :func:`evaluate`, g3-train's run (:func:`g3mpi.train.run.execute`) called
from a script, every rank of ``mpiexec -n P python script.py`` calling it together.

    import g3mpi
    result = g3mpi.train(parts="cora-parts", out="runs/cora-gcn", model="gcn", epochs=200)
    result.summary["test_acc"], result.model, result.run_dir

Settings as g3-train takes them (docs/RUNTIME.md): the defaults, then ``config`` (a TOML file, a dict or a
:class:`~g3mpi.train.TrainConfig`), then the keyword settings (the options' names with underscores). The run
directory is written as by g3-train. A run that fails raises :class:`RunFailed` on every rank after rank 0 has
printed the job's error lines, as g3-train would; an error g3-train ends the job on (a file of the run
directory, an exception in a user's model) still ends it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

PROG = "g3mpi.train"


class RunFailed(RuntimeError):
    """A run that did not finish; ``code`` is the exit status g3-train would have had (2: bad settings, 1: an
    error, 69: a rank stopped answering). The job's error lines are already on stderr."""

    def __init__(self, code: int, what: str):
        super().__init__(what)
        self.code = code


@dataclass(frozen=True)
class Result:
    """A finished (or stopped) run: ``summary`` (summary.json's content, on every rank; a stopped run's
    ``stopped``, ``epoch`` and ``reason``), ``model`` (this rank's trained module, the best-validation parameters,
    on the run's communicator), ``run_dir``, ``config`` (the resolved :class:`~g3mpi.train.TrainConfig`)."""
    summary: dict
    model: object
    run_dir: Path
    config: object


def _settings(config, settings: dict) -> dict:
    """g3-train's parsed command line (``--config`` and ``--resume`` included) from ``config`` and the keywords."""
    args = dict(config=None, resume=settings.pop("resume", None))
    if config is None or isinstance(config, (str, Path)):
        args["config"] = None if config is None else str(config)
        given = {}
    elif isinstance(config, dict):
        given = {k.replace("-", "_"): v for k, v in config.items()}
    elif dataclasses.is_dataclass(config):   # a TrainConfig: the settings it changes from the defaults
        given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                 if getattr(config, f.name) != f.default}
    else:
        raise TypeError(f"config: expected a TOML path, a dict or a TrainConfig, got {type(config).__name__}")
    given.update({k.replace("-", "_"): v for k, v in settings.items()})
    for k in ("parts", "out", "init_from"):
        if isinstance(given.get(k), Path):
            given[k] = str(given[k])
    return {**args, **given}


def train(config=None, /, *, comm=None, **settings) -> Result:
    """Train on ``comm`` (default COMM_WORLD; every rank calls this with the same settings) and return the
    :class:`Result`. ``config``: a TOML file, a dict of settings or a TrainConfig; ``settings``: keyword settings
    over it (``parts``, ``out``, ``model``, ``epochs``, ..., and ``resume=RUN`` to continue a run)."""
    from g3mpi.cli.train import config_check, settings as resolve
    from g3mpi.mpi.stop import StopSignals
    from g3mpi.train.config import ConfigError, TrainConfig
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    known = {f.name for f in dataclasses.fields(TrainConfig)} | {"resume"}
    unknown = [k for k in settings if k.replace("-", "_") not in known]
    err = cfg = None
    try:
        if unknown:
            from g3mpi.options import did_you_mean
            raise ConfigError(f"unknown setting {unknown[0]!r}{did_you_mean(unknown[0], sorted(known))}")
        cfg, given, resume = resolve(_settings(config, dict(settings)))
    except ConfigError as e:
        err = str(e)
    if not config_check(comm, err, 0.0 if cfg is None else cfg.comm_timeout, own_world=False):
        raise RunFailed(2, err or "the settings of another rank were refused")
    from g3mpi.train.rundir import RunLock
    from g3mpi.train.run import execute
    with StopSignals() as stop, RunLock() as lock:
        code, done = execute(comm, cfg, given, resume, stop=stop, lock=lock, own_world=False, prog=PROG)
    if done is None:
        raise RunFailed(code, f"{PROG}: the run in {cfg.out} failed (exit status {code}); its lines are above")
    from g3mpi.mpi.collectives import allgather_text
    # rank 0's summary as text (no pickle between ranks)
    summary = json.loads(allgather_text(comm, json.dumps(done.summary) if comm.rank == 0 else None, "summary")[0])
    return Result(summary=summary, model=done.model, run_dir=Path(done.run_dir), config=cfg)


def evaluate(model, config=None, /, *, comm=None, **settings) -> Result:
    """Evaluate trained parameters without training: ``model`` a ``model.pt`` or the run directory holding one,
    on the partition ``parts`` (any number of ranks), with the run's settings (``config``: e.g. RUN/config.toml
    with ``force``, or keywords: the model's architecture must match). The scores are in ``summary``, the
    predictions in ``out``'s predictions.h5 (g3-train ``--init-from MODEL --epochs 0``)."""
    path = Path(model)
    if path.is_dir():
        path = path / "model.pt"
    return train(config, comm=comm, **{**settings, "init_from": str(path), "epochs": 0})
