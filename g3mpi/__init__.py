"""g3mpi: exact full-graph GNN training over MPI ranks.

From Python (every rank of ``mpiexec -n P python script.py``): ``g3mpi.train(config | settings, comm=None)`` and
``g3mpi.evaluate(model, ...)`` (:mod:`g3mpi.api`). Importing g3mpi imports neither MPI nor torch."""
__version__ = "0.1.0"


def __getattr__(name: str):
    # g3mpi.train is the package of the trainer, callable as the API's train (g3mpi/train/__init__.py); both are
    # imported on first use, so that `import g3mpi` stays free of torch and MPI
    if name == "train":
        from importlib import import_module
        return import_module("g3mpi.train")
    if name in ("evaluate", "RunFailed", "Result"):
        from g3mpi import api
        return getattr(api, name)
    raise AttributeError(f"module 'g3mpi' has no attribute {name!r}")
