"""MPI helper for the memory-scaling test: a whole ``g3-train`` run, then the sizes of what each rank held.

mpiexec -n P python -m mpi4py -m tests.mpi_memory OUT.json -- G3-TRAIN-ARGS...
Each rank runs ``g3mpi.cli.train.main`` under ``tracemalloc`` (which traces numpy's and h5py's array buffers,
not torch's) until the trainer is closed, after its last epoch, the evaluation, predictions.h5 and the
checkpoint; then it lists every numpy array and torch tensor that any object of the process still refers to
(the part, the graph view and its blocks, the halo buffers, the model, the optimiser's states, the masks). Rank 0 writes
OUT.json: per rank its owned, halo and local edge counts, the traced peak of each stage that touches the graph's
data (loading the part, the halo check, the start-up sums, building the trainer, the run: training, evaluation,
predictions.h5, checkpoints) above what was traced before it, and the five arrays with the longest dimension.
"""
from __future__ import annotations

import gc
import json
import sys
import tracemalloc

import numpy as np
import torch
from mpi4py import MPI


def held_arrays() -> list[dict]:
    """Every numpy array and torch tensor reachable from a gc-tracked container, with its longest dimension
    (a sparse tensor's stored entries count as one: its dense shape is not memory)."""
    seen, found = set(), []
    for obj in gc.get_objects():
        for x in [obj, *gc.get_referents(obj)]:
            if id(x) in seen or not isinstance(x, (np.ndarray, torch.Tensor)):
                continue
            seen.add(id(x))
            shape = tuple(x.shape)
            longest = max(shape, default=1)
            if isinstance(x, torch.Tensor) and x.layout != torch.strided:
                longest = max(max(shape[1:], default=1), int(x._nnz()))
                if x.layout == torch.sparse_csr:
                    longest = max(longest, shape[0] + 1)
            found.append(dict(longest=int(longest), shape=list(shape), dtype=str(x.dtype), type=type(x).__name__))
    return sorted(found, key=lambda a: -a["longest"])


def import_lazily_loaded_modules() -> None:
    """What torch loads on first use (its optimisers import torch._dynamo: about 60 MB of Python objects; its first
    ``manual_seed`` reads the source lines of the stack into ``linecache``), so that the traced peaks count the
    run's data, not modules."""
    torch.manual_seed(0)
    torch.sparse_csr_tensor(torch.tensor([0, 1]), torch.tensor([0]), torch.ones(1), (1, 1)) @ torch.ones(1, 1)
    w = torch.zeros(2, requires_grad=True)
    for opt in (torch.optim.Adam([w]), torch.optim.SGD([w], lr=0.1, momentum=0.9)):
        w.sum().backward()
        opt.step()


def traced_stage(record: dict, owner, name: str) -> None:
    """Replace ``owner.name`` by a wrapper that records the peak of traced memory during the call above what was
    traced when it began (``record["stages"][name]``, the largest over its calls)."""
    f = getattr(owner, name)

    def stage(*args, **kw):
        if not tracemalloc.is_tracing():
            return f(*args, **kw)
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        try:
            return f(*args, **kw)
        finally:
            if tracemalloc.is_tracing():
                peak = tracemalloc.get_traced_memory()[1] - before
                record["stages"][name] = max(peak, record["stages"].get(name, 0))

    setattr(owner, name, stage)


def main() -> int:
    out, args = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    from g3mpi.cli import train as cli
    from g3mpi.train import startup
    from g3mpi.train import trainer as trainer_mod

    comm = MPI.COMM_WORLD
    record = dict(stages={})
    close = trainer_mod.Trainer.close

    def inspect_then_close(self):
        tracemalloc.stop()   # (the inspection's own lists are not the run's)
        part = self.part
        record.update(owned=part.num_owned, halo=part.num_halo, local_edges=part.num_local_edges,
                      num_nodes=part.num_nodes, largest=held_arrays()[:5])
        close(self)

    trainer_mod.Trainer.close = inspect_then_close
    # the stages that touch the graph's data; what happens between them is argument parsing and imports
    for owner, name in ((startup, "read_part"), (startup, "check_neighbours"),
                        (startup, "start_up_sums"), (trainer_mod.Trainer, "__init__"),
                        (trainer_mod.Trainer, "fit")):
        traced_stage(record, owner, name)
    import_lazily_loaded_modules()
    tracemalloc.start()
    status = cli.main(args)
    ranks = comm.gather(dict(record, status=status), root=0)
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(ranks, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
