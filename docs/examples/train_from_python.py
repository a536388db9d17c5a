"""Train a GCN on Cora from Python, every rank of the job running this script:

    mpiexec -n 2 python docs/examples/train_from_python.py [WORK_DIR]

Rank 0 prepares data/cora.npz and partitions it into one part per rank (under WORK_DIR, default
runs/cora-python), then every rank calls g3mpi.train, which writes the run directory as g3-train does and
returns its summary and this rank's trained module. Rank 0 prints the summary, then every rank evaluates the
saved model.pt again with g3mpi.evaluate."""
import json
import sys
from pathlib import Path

from mpi4py import MPI

import g3mpi

REPO = Path(__file__).resolve().parents[2]
comm = MPI.COMM_WORLD
work = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/cora-python")
graph, parts = work / "cora.h5", work / f"cora-parts{comm.size}"
if comm.rank == 0 and not (parts / "meta.json").is_file():   # the data tools' library, on one rank
    from data_tools.importers.common import PrepareOptions
    from data_tools.partition import PartitionConfig, run
    from data_tools.prepare import NpzSource, PrepareConfig, prepare
    work.mkdir(parents=True, exist_ok=True)
    prepare(PrepareConfig(NpzSource(REPO / "data" / "cora.npz"), graph,
                          PrepareOptions(normalize_features=True, force=True, quiet=True)))
    run(PartitionConfig(graph=graph, parts=comm.size, method="metis", out=parts, force=True, progress=False))
comm.Barrier()

result = g3mpi.train(parts=str(parts), out=str(work / "run"), force=True, model="gcn", layers=2, hidden=16,
                     dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200, log_level="WARNING")
if comm.rank == 0:
    print(json.dumps({k: result.summary[k] for k in ("model", "world_size", "epochs", "best_epoch", "train_acc",
                                                      "val_acc", "test_acc", "epoch_time_median_s")}, indent=1))
    print(f"trained module: {type(result.model).__name__}, run directory: {result.run_dir}")

again = g3mpi.evaluate(result.run_dir, parts=str(parts), out=str(work / "eval"), force=True, model="gcn",
                       layers=2, hidden=16, log_level="WARNING")
if comm.rank == 0:
    print(f"evaluated {result.run_dir / 'model.pt'}: test accuracy {again.summary['test_acc']:.4f}")
