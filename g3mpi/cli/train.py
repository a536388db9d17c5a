"""g3-train: distributed full-graph GNN training, one rank per partition part.

    mpiexec -n P g3-train --parts PARTS --out RUN [--config run.toml] [--model gcn|sage|gat] [...]
    mpiexec -n P python -m mpi4py -m g3mpi.cli.train --parts PARTS --out RUN [...]

Settings come from the defaults, then ``--config`` (TOML, keys as the long options with underscores), then
the command line. The resolved configuration is saved as RUN/config.toml. Errors are reported on every rank
(``g3-train: error: [rank r] ...``) and every rank exits non-zero.
"""
from __future__ import annotations

import argparse
import sys
import traceback

from mpi4py import MPI

PROG = "g3-train"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", help="partition directory (meta.json + part-*.h5)")
    ap.add_argument("--out", help="run directory to create")
    ap.add_argument("--config", help="TOML file with settings (command-line options override it)")
    g = ap.add_argument_group("model")
    g.add_argument("--model", choices=("gcn", "sage", "gat"))
    g.add_argument("--layers", type=int)
    g.add_argument("--hidden", type=int, help="hidden channels (per head for GAT)")
    g.add_argument("--heads", type=int, help="GAT heads in hidden layers")
    g.add_argument("--out-heads", type=int, help="GAT heads in the last layer (averaged)")
    g.add_argument("--dropout", type=float, help="dropout on every layer's input")
    g.add_argument("--attn-dropout", type=float, help="GAT attention dropout")
    g.add_argument("--activation")
    g = ap.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=("adam", "sgd"))
    g.add_argument("--lr", type=float)
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--momentum", type=float)
    g.add_argument("--epochs", type=int)
    g.add_argument("--eval-every", type=int)
    g.add_argument("--patience", type=int, help="early stopping: evaluations without improvement (0: off)")
    g.add_argument("--seed", type=int)
    g = ap.add_argument_group("runtime")
    g.add_argument("--threads", type=int, help="torch threads per rank")
    g.add_argument("--schedule", choices=("pipelined", "blocking", "nocomm"))
    g.add_argument("--chunk-rows", type=int, help="rows per aggregation chunk (0: automatic, <0: no chunks)")
    g.add_argument("--sim-net", help="simulated network BANDWIDTH,LATENCY, e.g. 10Gbit,20us")
    g.add_argument("--no-verify", dest="verify", action="store_const", const=False,
                   help="skip part-file checksums")
    g.add_argument("--no-progress", dest="progress", action="store_const", const=False)
    g.add_argument("--log-level")
    g.add_argument("--force", action="store_const", const=True, help="replace an existing run directory")
    return ap


def _error(comm, msg: str) -> None:
    print(f"{PROG}: error: [rank {comm.rank}] {msg}", file=sys.stderr, flush=True)


def main(argv=None, comm=None) -> int:
    comm = comm or MPI.COMM_WORLD
    ap = build_parser()
    args = vars(ap.parse_args(argv))
    from g3mpi.format import FormatError, read_meta, read_part
    from g3mpi.log import setup_logging
    from g3mpi.train import ConfigError, Trainer, config_from, prepare_run_dir

    try:
        cfg = config_from(args.pop("config"), args)
        if not cfg.parts:
            raise ConfigError("no partition directory given (--parts)")
        if not cfg.out:
            raise ConfigError("no run directory given (--out)")
    except ConfigError as e:
        _error(comm, str(e))
        return 2
    log = setup_logging(comm, cfg.log_level)

    # every rank loads its own part; failures anywhere are agreed on before any exchange starts
    err, part, meta = None, None, None
    try:
        meta = read_meta(cfg.parts)
        if meta["num_parts"] != comm.size:
            raise FormatError(f"{cfg.parts}/meta.json",
                              f"the partition has {meta['num_parts']} parts but {comm.size} ranks were started "
                              f"(run with mpiexec -n {meta['num_parts']})")
        part = read_part(cfg.parts, comm.rank, meta, verify=cfg.verify)
    except FormatError as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - any load failure must reach every rank
        err = f"{type(e).__name__}: {e}"
    errs = comm.allgather(err)
    if any(errs):
        if err:
            _error(comm, err)
        else:
            bad = [r for r, e in enumerate(errs) if e]
            _error(comm, f"stopping: rank(s) {bad} failed to load their part")
        return 1
    run_dir, err = prepare_run_dir(comm, cfg)
    if err:
        _error(comm, err)
        return 1
    log.info("part %d: %d owned, %d halo, %d local edges; model %s", part.part_id, part.num_owned,
             part.num_halo, int(part.indptr[-1]), cfg.model)
    trainer = None
    try:
        trainer = Trainer(cfg, comm, part, meta)
        summary = trainer.fit(run_dir)
        trainer.close()
    except Exception:  # noqa: BLE001 - one failing rank must not leave the others waiting
        _error(comm, "training failed:\n" + traceback.format_exc())
        comm.Abort(1)
        return 1
    if comm.rank == 0:
        log.info("done: best epoch %s, val %.4f, test %.4f, median epoch %.4fs -> %s", summary["best_epoch"],
                 summary["val_acc"] or float("nan"), summary["test_acc"] or float("nan"),
                 summary["epoch_time_median_s"] or float("nan"), run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
