"""Training: configuration, start-up, the distributed trainer, the run directory.

The names below are imported on first use (PEP 562), not with the package: g3-train installs its stop-signal
handlers (:mod:`g3mpi.mpi.stop`, which needs no torch) before it imports torch, which takes seconds of its start-up."""
import sys
import types
from importlib import import_module

#: the module of each name
_HOMES = {"ConfigError": "config", "TrainConfig": "config", "config_from": "config", "to_toml": "config",
          "Trainer": "trainer", "prepare_run_dir": "rundir"}

__all__ = ["ConfigError", "TrainConfig", "config_from", "to_toml", "Trainer", "prepare_run_dir"]


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """``g3mpi.train(...)``: the package is also the Python API's :func:`g3mpi.api.train` (a subpackage named
    train takes the name ``g3mpi.train`` once anything in it is imported, so a function there would be lost)."""

    def __call__(self, config=None, /, **kwargs):
        from g3mpi.api import train
        return train(config, **kwargs)


sys.modules[__name__].__class__ = _Package
