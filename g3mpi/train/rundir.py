"""The run directory: config.toml, metrics.jsonl, summary.json, model.pt, predictions.h5 (and checkpoint.pt,
:mod:`.checkpoint`); its preparation by rank 0 at start-up (:func:`prepare_run_dir`).

Whole files are written atomically (temporary file beside the target, then rename). ``predictions.h5`` is
written without gathering the graph on one rank: the ranks take turns, passing a token with point-to-point
messages; each opens the one temporary file, writes its own rows (by original node ID) and hands it on; rank 0
renames it into place once the last rank has written. With an active watchdog (``--comm-timeout``) each of these
waits has its deadline: a rank that never takes or hands on its turn ends the job with one line naming it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import statistics
from pathlib import Path

import h5py
import numpy as np

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.format import FormatError, atomic_file, json_text, write_json
from g3mpi.format.errors import failure_reason

from .checkpoint import CHECKPOINT_NAME, prune_shards, write_torch
from .config import ConfigError, TrainConfig, config_from, to_toml
from .choices import SUFFIX

log = logging.getLogger("g3mpi.train")

PREDICTIONS_FORMAT = "g3mpi-predictions"
EMBEDDINGS_FORMAT, EMBEDDINGS = "g3mpi-embeddings", "embeddings.h5"
#: the node splits, and the keys of their accuracies in metrics.jsonl and summary.json
SPLITS = ("train", "val", "test")
ACCURACY_KEYS = tuple(f"{s}_acc" for s in SPLITS)
#: every metric key an evaluated epoch may have (the accuracies and each --metric's)
METRIC_KEYS = tuple(f"{s}_{m}" for m in SUFFIX.values() for s in SPLITS)
_TOKEN_TAG = 7301
#: the lock file of a run directory (held by the rank 0 of the run that uses it)
LOCK_NAME = ".g3-train.lock"
#: the files :func:`.plots.plot_run` draws; the recorded timeline (``--timeline-epoch``) and its plot
PLOTS = ("training.png", "ranks.png")
TIMELINE, TIMELINE_PLOT = "timeline.json", "timeline.png"
#: the files of a run directory
RUN_FILES = ("metrics.jsonl", "summary.json", "model.pt", "predictions.h5", "config.toml", CHECKPOINT_NAME, TIMELINE,
             TIMELINE_PLOT, *PLOTS, EMBEDDINGS)
#: flock's errors on a file system that has no locks (Lustre without ``-o flock``, NFS without a lock daemon)
_NO_LOCKS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)


class OutputError(Exception):
    """A file of the run directory could not be written (disk full, permissions, a vanished directory); the
    message names it. g3-train reports it in one line per rank and ends the job."""

    def __init__(self, path, reason=None):
        """``path`` and why; or, without ``reason``, the whole message (one another rank wrote)."""
        super().__init__(str(path) if reason is None else f"{path}: cannot be written: {reason}")


@contextlib.contextmanager
def writing(path, *errors):
    """Turn the failures of a write of ``path`` (OSError, the format's output checks, and ``errors``) into
    :class:`OutputError` naming it."""
    try:
        yield
    except (OSError, FormatError, *errors) as e:
        raise OutputError(path, failure_reason(e)) from None


def write_text_atomic(path, text: str) -> None:
    with writing(path), atomic_file(path, force=True) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def write_json_atomic(path, obj) -> None:
    with writing(path):
        write_json(path, obj)


def save_state_dict(path, state: dict) -> None:
    """A plain state_dict of tensors (loadable with ``torch.load(path, weights_only=True)``), written atomically;
    a failed write is an :class:`OutputError` naming ``path``."""
    with writing(path, RuntimeError):
        write_torch(path, {k: v.detach().cpu().clone() for k, v in state.items()})


class RunDirBusy(Exception):
    """Another g3-train run holds the run directory's lock; the message names the directory and its holder."""


class RunLock:
    """``RUN/.g3-train.lock``: one run at a time in a run directory. Rank 0 takes it (``flock``, exclusive) before
    it writes anything there and holds it until the process ends; a second run, new (``--force`` too) or
    ``--resume``, is refused while the first one lives instead of writing over its files. The kernel releases the
    lock when the process dies however it dies (SIGKILL, ``MPI_Abort``), so a crashed run leaves no lock to clear
    by hand, at most the file, which the next run takes over. ``release`` (or leaving the ``with`` block) removes
    the file. Where the file system has no locks, the run goes on with a warning."""

    def __init__(self):
        self._fd = None
        self.path = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self, run_dir) -> None:
        """Hold the lock of ``run_dir`` (an existing directory); :class:`RunDirBusy` if another process holds it."""
        path = Path(run_dir) / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip()
                os.close(fd)
                holder = f"process {holder.replace(' ', ' on ', 1)}" if holder else "a process"
                raise RunDirBusy(f"{run_dir}: another g3-train run is using this run directory ({holder} holds "
                                 f"{path.name}); wait for it to end, or choose another --out") from None
            except OSError as e:
                os.close(fd)
                if e.errno not in _NO_LOCKS:
                    raise
                path.unlink(missing_ok=True)
                log.warning("%s: cannot be locked (%s): this run is not guarded against a second one started in "
                            "%s", path, os.strerror(e.errno), run_dir)
                return
            # the holder before us may have removed the file between our open and our lock: hold the one in place
            try:
                here = os.stat(path)
            except FileNotFoundError:
                here = None
            mine = os.fstat(fd)
            if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd, self.path = fd, path

    def release(self) -> None:
        """Remove the lock file and let go of the lock (a no-op when not held)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def _number(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _record(line: str) -> dict | None:
    """One metrics.jsonl line as its record, or None for a line that is not one (cut short by a crash, or any
    other JSON value than an object with an integer ``epoch`` whose values are numbers, nulls or lists of them,
    as g3-train writes them)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(rec, dict) and isinstance(rec.get("epoch"), int)):
        return None
    ok = all(_number(v) or (isinstance(v, list) and all(map(_number, v))) for v in rec.values())
    return rec if ok else None


def read_metrics(path) -> list[dict]:
    """The records of a metrics.jsonl in epoch order; a line that is not a record is skipped."""
    with open(path, encoding="utf-8", errors="replace") as f:
        out = [rec for rec in map(_record, f) if rec is not None]
    return sorted(out, key=lambda r: r["epoch"])


def run_timings(records: list[dict]) -> dict:
    """summary.json's timing figures from metrics.jsonl's records: medians over every trained epoch of the run (a
    resumed run's epochs of every job, not only the last job's; None when no epoch was trained). Per epoch: the
    slowest rank's epoch, compute and blocked time, the lowest rank overlap, the bytes all ranks sent."""
    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def over_ranks(r, key, pick):
        vals = [v for v in r.get(key) or () if v is not None]
        return pick(vals) if vals else None

    eps = [r for r in records if "epoch_time_s" in r]
    return dict(epoch_time_median_s=med(r["epoch_time_s"] for r in eps),
                compute_time_median_s=med(over_ranks(r, "rank_compute_s", max) for r in eps),
                blocked_time_median_s=med(over_ranks(r, "rank_blocked_s", max) for r in eps),
                overlap_median=med(over_ranks(r, "rank_overlap", min) for r in eps),
                bytes_sent_per_epoch=med(r.get("bytes_sent") for r in eps))


def rewind_metrics(path, last_epoch: int, eval_every: int = 1) -> None:
    """Keep only the metrics.jsonl lines of epochs <= ``last_epoch`` (a resumed run continues after them). The
    accuracies of ``last_epoch`` go too when it is off the ``eval_every`` grid: the run that wrote it evaluated
    there only because it was its last epoch, and a straight run would not have."""
    path = Path(path)
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        rec = _record(line)
        if rec is None:  # a line cut short by a crash, or not a record at all
            continue
        if rec["epoch"] == last_epoch and last_epoch % eval_every and "val_acc" in rec:
            line = json_text({k: v for k, v in rec.items() if k not in METRIC_KEYS}, indent=None)
        if rec["epoch"] <= last_epoch:
            keep.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in keep))


class MetricsLog:
    """metrics.jsonl: one JSON object per epoch, appended and flushed line by line (rank 0 only)."""

    def __init__(self, path):
        self.path = Path(path)
        with writing(self.path):
            self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        with writing(self.path):   # a resume skips the partial line this may leave (rewind_metrics)
            self._f.write(json_text(record, indent=None) + "\n")
            self._f.flush()

    def close(self) -> None:
        with writing(self.path):
            self._f.close()


#: rows per read-modify-write block when a rank's original IDs are scattered through the file
SCATTER_BLOCK_ROWS = 1 << 16


def write_rows(ds, sorted_ids: np.ndarray, values: np.ndarray) -> None:
    """``ds[sorted_ids] = values`` for strictly increasing IDs, in a few large HDF5 operations.

    IDs are taken block by block (SCATTER_BLOCK_ROWS); a block whose IDs are one consecutive run is written
    directly, any other is read, patched in memory and written back (ranks write in turn, so this is safe).
    One h5py call per ID run would make scattered IDs (any real partition) cost one HDF5 write per row.
    """
    if len(sorted_ids) == 0:
        return
    blk = sorted_ids // SCATTER_BLOCK_ROWS
    cut = np.nonzero(np.diff(blk))[0] + 1
    for a, b in zip(np.concatenate([[0], cut]).tolist(), np.concatenate([cut, [len(sorted_ids)]]).tolist()):
        lo, hi = int(sorted_ids[a]), int(sorted_ids[b - 1]) + 1
        if hi - lo == b - a:
            ds[lo:hi] = values[a:b]
        else:
            buf = ds[lo:hi]
            buf[sorted_ids[a:b] - lo] = values[a:b]
            ds[lo:hi] = buf


def write_predictions(comm, path, orig_ids: np.ndarray, logits: np.ndarray, num_nodes: int,
                      attrs: dict | None = None, watchdog: Watchdog | None = None, on_turn=None,
                      pred: np.ndarray | None = None) -> None:
    """Collectively write ``path`` (HDF5): ``logits`` float32 [N, C] and ``pred`` int64 [N] (the task's
    predictions, :func:`g3mpi.train.tasks.predict`, default the argmax; multilabel: int8 [N, C] of 0/1), row =
    original ID.

    Every rank passes its owned rows; the file appears (atomically) only if every rank wrote successfully,
    otherwise every rank raises. ``watchdog`` (on ``comm``) bounds the waits for the other ranks' turns, each
    by its timeout per turn waited for (rank r waits for r turns before its own, rank 0 for the P - 1 after
    its own, and everyone for at most P before the file is in place); without one they block. ``on_turn``: called
    when this rank's turn comes, before it writes (the tests' fault injection).
    """
    order = np.argsort(orig_ids, kind="stable")
    ids = np.asarray(orig_ids, np.int64)[order]
    lg = np.ascontiguousarray(logits[order], dtype=np.float32)
    if pred is None:
        pred = lg.argmax(axis=1).astype(np.int64) if lg.shape[1] else np.zeros(len(ids), np.int64)
    else:
        pred = np.ascontiguousarray(pred[order])

    def create(f):
        f.attrs["num_nodes"] = int(num_nodes)
        # the logits' columns; the graph's classes may differ (binary: 1 output, 2 classes), which the caller
        # gives in attrs
        f.attrs["num_classes"] = f.attrs["num_outputs"] = int(lg.shape[1])
        f.create_dataset("logits", shape=(num_nodes, lg.shape[1]), dtype=np.float32, fillvalue=np.nan)
        f.create_dataset("pred", shape=(num_nodes, *pred.shape[1:]), dtype=pred.dtype, fillvalue=-1)

    def write(f):
        write_rows(f["logits"], ids, lg)
        write_rows(f["pred"], ids, pred)

    write_in_turns(comm, path, create, write, attrs, watchdog, on_turn)


def write_link_predictions(comm, path, rows: dict, attrs: dict | None = None, watchdog: Watchdog | None = None,
                           on_turn=None) -> None:
    """Collectively write ``path`` (HDF5) of a link task: per dataset name, ``rows[name] = (index [m], values [m,
    ...], total)``: this rank's rows of a dataset of ``total`` rows (each pair's position in its split), written in
    the ranks' turns and put in place atomically as :func:`write_predictions` does."""
    rows = {k: (np.asarray(i, np.int64), np.asarray(v), int(t)) for k, (i, v, t) in rows.items()}

    def create(f):
        for k, (_, v, t) in rows.items():
            fill = np.nan if v.dtype.kind == "f" else -1
            f.create_dataset(k, shape=(t, *v.shape[1:]), dtype=v.dtype, fillvalue=fill)

    def write(f):
        for k, (i, v, _) in rows.items():
            order = np.argsort(i, kind="stable")
            write_rows(f[k], i[order], np.ascontiguousarray(v[order]))

    write_in_turns(comm, path, create, write, attrs, watchdog, on_turn)


def write_embeddings(comm, path, orig_ids: np.ndarray, tables: dict, num_nodes: int, attrs: dict | None = None,
                     watchdog: Watchdog | None = None, on_turn=None) -> None:
    """Collectively write ``path`` (HDF5, format ``g3mpi-embeddings``): per name, ``tables[name]`` this rank's
    owned rows [n, dim] of a node-embedding table, written at their original node IDs in the ranks' turns (no rank
    holds more than its own rows) and put in place atomically as :func:`write_predictions` does."""
    order = np.argsort(orig_ids, kind="stable")
    ids = np.asarray(orig_ids, np.int64)[order]
    rows = {k: np.ascontiguousarray(np.asarray(v, np.float32)[order]) for k, v in tables.items()}

    def create(f):
        f.attrs["num_nodes"] = int(num_nodes)
        for k, v in rows.items():
            f.create_dataset(k, shape=(num_nodes, v.shape[1]), dtype=np.float32, fillvalue=np.nan)

    def write(f):
        for k, v in rows.items():
            write_rows(f[k], ids, v)

    write_in_turns(comm, path, create, write, dict(format=EMBEDDINGS_FORMAT, **(attrs or {})), watchdog, on_turn)


def write_in_turns(comm, path, create, write, attrs: dict | None = None, watchdog: Watchdog | None = None,
                   on_turn=None) -> None:
    """Write ``path`` (HDF5) rank by rank: rank 0 makes a temporary file with the predictions' format attributes,
    ``attrs`` and ``create(f)``; every rank then runs ``write(f)`` in its turn; rank 0 puts the file in place
    once every rank has written, else every rank raises :class:`OutputError` (:func:`write_predictions`)."""
    path = Path(path)
    wd = watchdog or Watchdog(comm, 0)
    what = f"ranks' turns writing {path.name}"
    tmp = path.parent / f".{path.name}.tmp"
    rank, size = comm.rank, comm.size
    err = None
    if rank > 0:
        err = wd.recv_text(rank - 1, _TOKEN_TAG, f"{what} (rank {rank - 1} writes before rank {rank})", turns=rank)
    if on_turn is not None:
        on_turn()
    if err is None:
        try:
            with h5py.File(tmp, "w" if rank == 0 else "r+") as f:
                if rank == 0:
                    f.attrs["format"] = PREDICTIONS_FORMAT
                    f.attrs["version"] = 1
                    create(f)
                    for k, v in (attrs or {}).items():
                        f.attrs[k] = v
                write(f)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = f"{failure_reason(e)} (on rank {rank})"
    if size > 1:
        wd.send_text(err, (rank + 1) % size, _TOKEN_TAG, f"{what} (handing the turn on)")
        if rank == 0:
            err = wd.recv_text(size - 1, _TOKEN_TAG, f"{what} (rank {size - 1} writes last and hands the file back "
                                                     "to rank 0)", turns=size - 1)
    if rank == 0:
        try:
            if err is None:
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())   # (where a full disk may show first: NFS, delayed allocation)
                os.replace(tmp, path)
        except OSError as e:
            err = f"{failure_reason(e)} (on rank 0, putting the file in place)"
        if err is not None:
            Path(tmp).unlink(missing_ok=True)
    err = wd.bcast_text(err, 0, f"{what} (rank 0 puts the file in place once every rank has written)", turns=size)
    if err is not None:
        raise OutputError(path, err)


# -- preparing the run directory ---------------------------------------------------------------------------
def prepare_run_dir(comm, cfg: TrainConfig, resume_epoch: int | None = None, resume_eval_every: int | None = None,
                    watchdog: Watchdog | None = None, lock: RunLock | None = None) -> tuple[Path | None, str | None]:
    """Rank 0 creates the run directory (refusing a non-empty one without ``force``) and writes config.toml.
    With ``resume_epoch`` (``--resume``) the directory is kept and metrics.jsonl is cut back to that epoch (the
    accuracies of an off-grid last epoch go too, under the ``--eval-every`` of the run that wrote them, when the
    resumed run trains further). Either way the temporary files of writes a crash interrupted (``.NAME.*.tmp``,
    possibly a whole checkpoint's size) go. Rank 0 takes ``lock`` (a :class:`RunLock`, held by the caller until
    the run ends) before it changes anything there: a directory another run is using is refused. ``watchdog`` (on
    ``comm``) bounds the other ranks' wait for rank 0. Returns (path, error) identically on every rank."""
    err = None
    out = Path(cfg.out)
    if comm.rank == 0:
        try:
            if resume_epoch is not None:
                if lock is not None:
                    lock.acquire(out)
                _remove_interrupted_writes(out)
                grid = (resume_eval_every or cfg.eval_every) if cfg.epochs > resume_epoch else 1
                rewind_metrics(out / "metrics.jsonl", resume_epoch, grid)
                write_text_atomic(out / "config.toml", _saved_config(cfg))
            else:
                _create_run_dir(cfg, out, lock)
        except OSError as e:   # making the directory, its lock, removing old files: the file and the system's words
            err = f"{e.filename or out}: cannot be written: {failure_reason(e)}"
        except (ValueError, OutputError, RunDirBusy) as e:
            err = str(e)
        except Exception as e:  # noqa: BLE001 - the other ranks wait for rank 0's word below: never leave them waiting
            err = f"{out}: preparing the run directory failed: {type(e).__name__}: {e}"
    err = (watchdog or Watchdog(comm, 0)).bcast_text(err, 0, "start-up step 'run directory' (rank 0 prepares it)")
    return (None if err else out), err


def check_run_dir(cfg: TrainConfig) -> None:
    """ValueError unless ``cfg.out`` can become a new run directory: none there, an empty directory, or with
    ``--force`` one whose run files may be replaced. Reads only: g3-train's start-up asks it before any rank reads
    its part (seconds on a large graph), and :func:`prepare_run_dir` again when it makes the directory."""
    out = Path(cfg.out)
    if not cfg.out:
        raise ValueError("no run directory given (--out)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    if _occupied(out):
        if not cfg.force:
            raise ValueError(f"{out}: run directory exists and is not empty (use --force to replace it, or "
                             "--resume to continue its run)")
        _check_replaceable(out)


def _create_run_dir(cfg: TrainConfig, out: Path, lock: RunLock | None = None) -> None:
    check_run_dir(cfg)   # (before the lock: nothing is written into another's directory)
    out.mkdir(parents=True, exist_ok=True)  # runs/NAME works in a fresh directory, as the launchers' default
    if lock is not None:
        lock.acquire(out)
    if _occupied(out):   # looked at again under the lock: a run started at the same time may have written here
        check_run_dir(cfg)
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        prune_shards(out, None)
        _remove_interrupted_writes(out)
    write_text_atomic(out / "config.toml", _saved_config(cfg))


def _occupied(out: Path) -> bool:
    """A directory with anything in it but a lock file (the one a run that was killed leaves behind)."""
    return out.is_dir() and any(p.name != LOCK_NAME for p in out.iterdir())


def _check_replaceable(out: Path) -> None:
    """ValueError unless ``--force`` may remove the run files in the non-empty directory ``out``: none there, or
    a run directory's (its config.toml, written first, reads as g3-train's). A file of the user's that bears one
    of their names (a config.toml, a model.pt) in a directory that ``--out`` named by mistake is kept."""
    present = [name for name in RUN_FILES if os.path.lexists(out / name)]
    if not present:
        return
    try:
        config_from(str(out / "config.toml"))
        return
    except ConfigError:
        why = "its config.toml is not g3-train's" if "config.toml" in present else "it has no config.toml"
    raise ValueError(f"{out}: not a run directory ({why}) but holds {', '.join(present)}: not replaced, even with "
                     f"--force (remove them yourself or choose another --out)")


def _remove_interrupted_writes(out: Path) -> None:
    """The temporary files (``.NAME.*.tmp``) that writes of the run directory's files left when a crash cut them."""
    for name in RUN_FILES:
        for tmp in out.glob(f".{name}.*tmp"):
            tmp.unlink(missing_ok=True)


def _saved_config(cfg: TrainConfig) -> str:
    """RUN/config.toml: the resolved settings, the partition directory (and ``init_from``) as an absolute path, so
    that ``--resume RUN`` (and ``--config RUN/config.toml``) work from any working directory, e.g. a batch job's.
    ``force`` is saved off: it was this command's permission to replace a directory, and a rerun with ``--config
    RUN/config.toml --out OTHER`` must not replace OTHER unless it says so. ``time_limit`` is saved off too: it
    was this job's allocation (a resumed run gets its own from its launcher, G3_TIMEOUT, or ``--time-limit``).
    ``model_file_sha256`` records the model file as it is now (``--resume`` refuses a changed one, unless
    ``allow_changed_model``, which is saved off)."""
    from g3mpi.format.checksums import file_sha256
    return to_toml(cfg.replace(parts=str(Path(cfg.parts).resolve()), force=False, time_limit=0.0,
                               init_from=str(Path(cfg.init_from).resolve()) if cfg.init_from else "",
                               model_file_sha256=file_sha256(cfg.model_file.rpartition(":")[0]) if cfg.model_file else "",
                               allow_changed_model=False))
