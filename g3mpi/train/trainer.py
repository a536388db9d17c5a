"""Full-graph distributed training on one rank's part: the loop, evaluation, early stopping, the run directory.

Loss = sum over this rank's training nodes / number of training nodes in the whole graph, so the sum over
ranks is the single-process mean and the allreduced (summed) parameter gradients equal single-process ones.
Parameters are replicated (same seed, same initialisation on every rank); every rank steps its own optimiser on
identical gradients.
"""
from __future__ import annotations

import copy
import ctypes
import json
import logging
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from g3mpi.comm import CommContext, SimNet
from g3mpi.comm.timeline import Recorder, clock_offset, combine
from g3mpi.comm.watchdog import Watchdog
from g3mpi.format.errors import failure_reason
from g3mpi.format.limits import FLOAT32_SQUARE_LIMIT
from g3mpi.format.partition import id_checksum, part_name, range_checksum
from g3mpi.nn import GNN
from g3mpi.ops import DistGraph, DropoutKey
from g3mpi.sched import Schedule

from .checkpoint import CHECKPOINT_NAME, make_checkpoint, save_checkpoint
from .config import ConfigError, TrainConfig, config_from, to_toml
from .faults import TestHooks, TrainingFault, first_nonfinite
from .gradsync import GradSync
from .plots import PLOTS, TIMELINE, TIMELINE_PLOT, plot_run
from .rundir import (LOCK_NAME, SPLITS, MetricsLog, OutputError, RunDirBusy, RunLock, read_metrics, rewind_metrics,
                     run_timings, save_state_dict, write_json_atomic, write_predictions, write_text_atomic)
from .stop import STOP_SLOTS

log = logging.getLogger("g3mpi.train")
#: what each rank reports to rank 0 after every epoch (metrics.jsonl's rank_* lists), integers in INT_FIGURES
EPOCH_FIGURES = ("compute_s", "blocked_s", "comm_s", "overlap", "allreduce_s", "bytes_sent", "bytes_recv", "messages",
                 "epoch_time_s", "rss_bytes")
INT_FIGURES = ("bytes_sent", "bytes_recv", "messages", "rss_bytes")
#: the files of a run directory
RUN_FILES = ("metrics.jsonl", "summary.json", "model.pt", "predictions.h5", "config.toml", CHECKPOINT_NAME, TIMELINE,
             TIMELINE_PLOT, *PLOTS)


def _no_mark(phase: str) -> None:
    """The phase mark of an epoch that is not recorded."""


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


#: allocations from this size on get their own mapping, returned to the system when freed (glibc)
MMAP_THRESHOLD = 128 * 1024


def return_freed_memory() -> bool:
    """Make freed tensors and arrays go back to the system at once (glibc ``mallopt``; idempotent).

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), after which every
    allocation below it comes from the heap, whose freed space stays resident: one epoch's temporaries of a few
    MiB (interior rows, neighbour blocks, chunks) and the scipy arrays of setup then pin memory for the whole
    run (about 150 MiB per rank at 200k nodes / 4M edges). A fixed threshold keeps large blocks mapped and
    trims the heap top. Left alone if the user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``,
    and a no-op without glibc. Returns whether the setting was applied."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, MMAP_THRESHOLD))


def current_rss_bytes() -> int:
    """Resident set size now (Linux /proc; the peak where /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return peak_rss_bytes()


#: what the start-up sums found when two parts own the same original node ID
IDS_NOT_ONCE = ("the parts do not own every original node ID exactly once (two parts own the same node; "
                "g3-inspect names the part whose IDs disagree with node_map.h5)")


def start_up_sums(part, watchdog: Watchdog) -> tuple[dict, bool]:
    """What the ranks learn together at start-up, in one ``Allreduce`` (every rank calls it): the number of
    training, validation and test nodes of the whole graph (``{"train": ..., "val": ..., "test": ...}``), and
    whether the parts own every original node ID exactly once. Each part checks its own IDs on load (in range,
    strictly increasing); that no two parts own the same ID is the sum of the parts' :func:`id_checksum` against
    that of ``range(N)``, whose share each rank computes: that of its own new-ID range, as long as its original
    IDs (the new ranges of the parts tile ``range(N)``), so a rank's work is O(owned), whatever N is."""
    ids = (id_checksum(part.orig_ids) - range_checksum(part.owned_start, part.owned_end)) % (1 << 64)
    sums = np.array([int(getattr(part, f"{s}_mask").sum()) for s in SPLITS] + [ids], dtype=np.uint64)
    watchdog.allreduce(sums, what="start-up check 'split sizes'")   # (uint64 sums wrap: the checksum's modulus)
    return dict(zip(SPLITS, map(int, sums[:len(SPLITS)]))), int(sums[-1]) == 0


class Trainer:
    """Owns one rank's graph view, model and optimiser. ``comm`` is injected; every rank calls the same methods."""

    def __init__(self, cfg: TrainConfig, comm, part, meta: dict, stop=None, watchdog: Watchdog | None = None,
                 hooks: TestHooks | None = None, split_sizes: dict | None = None):
        """``stop``: a :class:`~g3mpi.train.stop.StopSignals` (or anything with a ``received`` attribute): when
        set on any rank, :meth:`fit` stops after the current epoch with a checkpoint. ``watchdog`` (on ``comm``,
        with ``cfg.comm_timeout``) and ``hooks`` are the caller's when it has them (g3-train's start-up uses
        them too), else made here. ``split_sizes``: from :func:`start_up_sums` when the caller has them already
        (g3-train checks them before building the model), else counted (and the ID ownership checked) here."""
        self.cfg, self.comm, self.part, self.meta = cfg, comm, part, meta
        self.stop = stop
        if cfg.release_memory:
            return_freed_memory()
        torch.set_num_threads(cfg.threads)
        simnet = SimNet.from_spec(cfg.sim_net) if cfg.sim_net else None
        self.watchdog = watchdog or Watchdog(comm, cfg.comm_timeout, prog="g3-train")
        self.hooks = hooks or TestHooks.from_env(comm.rank)
        # the epoch whose timeline is recorded (0: none); the clock offsets are estimated only then
        self.timeline_epoch = min(cfg.timeline_epoch, cfg.epochs)
        self.recorder = Recorder(comm.rank, *clock_offset(self.watchdog)) if self.timeline_epoch > 0 else None
        self.ctx = CommContext(comm, simnet, watchdog=self.watchdog if self.watchdog.active else None,
                               recorder=self.recorder)
        self.graph = DistGraph(part, self.ctx, Schedule(cfg.schedule, cfg.chunk_rows))
        torch.manual_seed(cfg.seed)
        self.model = GNN(self.graph, cfg.model, part.feature_dim, cfg.hidden, part.num_classes, layers=cfg.layers,
                         heads=cfg.heads, out_heads=cfg.out_heads, dropout=cfg.dropout,
                         attn_dropout=cfg.attn_dropout, activation=cfg.activation, input_cache=cfg.input_cache)
        self.named_params = list(self.model.named_parameters())
        self.params = [p for _, p in self.named_params]
        if cfg.optimizer == "adam":
            self.opt = torch.optim.Adam(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        else:
            self.opt = torch.optim.SGD(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum)
        self.x = torch.from_numpy(part.features)
        self.y = torch.from_numpy(part.labels)
        self.masks = {s: torch.from_numpy(getattr(part, f"{s}_mask")) for s in SPLITS}
        if split_sizes is None:
            split_sizes, ids_once = start_up_sums(part, self.watchdog)
            if not ids_once:
                raise ValueError(f"{cfg.parts}: {IDS_NOT_ONCE}")
        self.split_sizes = dict(split_sizes)
        if self.split_sizes["train"] == 0:
            raise ValueError(f"{cfg.parts}: the graph has no training nodes")
        if self.split_sizes["val"] == 0 and comm.rank == 0:
            log.warning("%s: no validation nodes: the model of the last evaluated epoch is kept%s", cfg.parts,
                        ", and --patience is ignored" if cfg.patience else "")
        # gradients summed over ranks layer by layer during backward (last layer first), overlapped with it
        self.gradsync = GradSync(comm, [list(c.parameters()) for c in reversed(self.model.convs)], self.watchdog)
        # the loss, the numbers of ranks with a non-finite loss / gradient, past the time limit, and with each stop
        # signal (STOP_SLOTS)
        self._flags = np.zeros(4 + len(STOP_SLOTS), dtype=np.float64)
        self.start_epoch = 1
        self.resumed = None   # the checkpoint this trainer continues from, if any
        self.given = False    # started from given parameters (start_from)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def restore(self, ckpt: dict) -> None:
        """Continue from a checkpoint (already checked with ``checkpoint.check_compatible``)."""
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        self.start_epoch = int(ckpt["epoch"]) + 1
        self.resumed = ckpt

    def start_from(self, state: dict) -> None:
        """Start from the parameters ``state`` (``--init-from``; names and shapes already checked with
        ``checkpoint.state_mismatch``) instead of the seeded initialisation."""
        self.model.load_state_dict(state)
        self.given = True

    def checkpoint(self, run_dir: Path, epoch: int, best: dict, since_best: int, last_loss) -> None:
        """Rank 0 writes RUN/checkpoint.pt atomically; a failure stops every rank (TrainingFault)."""
        err = None
        if self.comm.rank == 0:
            try:
                save_checkpoint(run_dir / CHECKPOINT_NAME, make_checkpoint(
                    epoch=epoch, model=self.model.state_dict(), optimizer=self.opt.state_dict(), best=best,
                    since_best=since_best, last_loss=last_loss, cfg=self.cfg, meta=self.meta))
            except Exception as e:  # noqa: BLE001 - reported on every rank
                err = f"{run_dir / CHECKPOINT_NAME}: writing the checkpoint failed: {failure_reason(e)}"
        failed = np.array([1.0 if err else 0.0])
        self.watchdog.allreduce(failed, what="checkpoint hand-off (rank 0 writes it)")
        if failed[0]:
            raise TrainingFault(err if self.comm.rank == 0 else "stopping: rank 0 could not write a checkpoint")

    # -- one epoch ----------------------------------------------------------------------------------------------
    def train_step(self, epoch: int) -> dict:
        """Forward, backward, gradient allreduce, optimiser step. Returns the global loss and this rank's timings."""
        stats = self.ctx.stats
        stats.reset()
        self.watchdog.context = f"epoch {epoch}"
        self.hooks.epoch_start(epoch)
        rec = self.recorder if epoch == self.timeline_epoch else None
        if rec is not None:
            rec.start(epoch)
        mark = rec.mark if rec is not None else _no_mark
        t0 = time.perf_counter()
        mark("forward")
        self.model.train()
        self.opt.zero_grad(set_to_none=False)
        logits = self.model(self.x, DropoutKey(self.cfg.seed, epoch))
        mark("loss")
        m = self.masks["train"]
        loss = F.cross_entropy(logits[m], self.y[m], reduction="sum") / self.split_sizes["train"]
        loss = self.hooks.corrupt_loss(epoch, loss)
        sync = self.gradsync
        sync.begin()
        mark("backward")
        loss.backward()
        sync.flush()
        self.hooks.corrupt_grads(epoch, self.named_params)
        mark("allreduce")
        t_ar = time.perf_counter()
        # this rank's gradients as computed (the buckets in flight hold copies of them)
        bad = first_nonfinite(loss.detach(), self.named_params)
        flags = self._flags
        got = self.stop.signal_name if self.stop is not None else None
        flags[:4] = (float(loss.detach()), 1.0 if bad == "loss" else 0.0, 1.0 if bad else 0.0,
                     float(self.stop is not None and self.stop.time_up))
        flags[4:] = [got == name for name in STOP_SLOTS]   # the last slot: any other signal
        flags[-1] = got is not None and got not in STOP_SLOTS[:-1]
        self.watchdog.allreduce(flags)
        sync.wait()
        # the largest summed gradient (NaN if any is NaN): beyond 2^64 its square overflows Adam's second moments,
        # which then freeze their parameters silently (the run went on and exited 0)
        peak = float(torch.linalg.vector_norm(sync.buf, float("inf"))) if sync.buf.numel() else 0.0
        if flags[2] > 0 or not np.isfinite(flags[0]) or not peak < FLOAT32_SQUARE_LIMIT:
            # every rank gets here together (the flags and the summed gradients are the same on all)
            logits_bad = int((~torch.isfinite(logits.detach())).any(dim=1).sum()) if bad == "loss" else 0
            raise TrainingFault(self._nonfinite_message(epoch, bad, int(flags[1]), int(flags[2]), peak,
                                                        (logits_bad, len(logits))) + self._feature_cause())
        sync.unpack()
        allreduce_s = time.perf_counter() - t_ar
        mark("step")
        self.opt.step()
        dt = time.perf_counter() - t0
        mark("end")
        if rec is not None:
            rec.stop()
        s = stats.as_dict()
        return dict(loss=float(flags[0]), time_up_ranks=int(flags[3]), signal_ranks=flags[4:].astype(int).tolist(),
                    epoch_time_s=dt, compute_s=dt - s["blocked_s"] - allreduce_s, blocked_s=s["blocked_s"],
                    comm_s=s["comm_s"], overlap=s["overlap"], allreduce_s=allreduce_s, bytes_sent=s["bytes_sent"],
                    bytes_recv=s["bytes_recv"], messages=s["messages_sent"])

    @staticmethod
    def _nonfinite_message(epoch: int, bad: str | None, n_loss: int, n_grad: int, peak: float = float("nan"),
                           logits: tuple = (0, 0)) -> str:
        """This rank's line about a non-finite loss or gradient, or summed gradients beyond 2^64 (``peak``, the
        largest). A NaN loss on one rank reaches its neighbours' gradients through the halo, so a rank blames its
        own gradients only when no rank's loss was bad. ``logits``: (rows of this rank's logits with a
        non-finite value, rows), for a bad loss: whether the logits were bad already."""
        kept = "training stopped, the last good checkpoint is kept"
        if bad == "loss":
            where = (f"already in the logits of {logits[0]} of its {logits[1]} nodes" if logits[0] else
                     "its logits are finite: the loss itself is not")
            return f"non-finite value (NaN or Inf) in the loss at epoch {epoch} on this rank ({where}); {kept}"
        if n_loss:
            return f"training stopped at epoch {epoch}: non-finite loss on {n_loss} other rank(s)"
        if bad:
            return f"non-finite value (NaN or Inf) in the gradient of {bad} at epoch {epoch} on this rank; {kept}"
        if n_grad:
            return f"training stopped at epoch {epoch}: non-finite gradient on {n_grad} other rank(s)"
        if np.isfinite(peak):
            return (f"the summed gradients reach {peak:.3g} at epoch {epoch}, beyond 2^64 = 1.8e19 "
                    f"(their squares overflow float32: Adam's second moments would become infinite); {kept}")
        return f"the summed gradients are not finite at epoch {epoch} (overflow); {kept}"

    def _feature_cause(self) -> str:
        """What every rank adds to its line about non-finite values: the part file (and rank) with the largest
        feature magnitude if it is beyond 2^64 (too large for float32 training), else that the inputs are
        moderate. One allreduce of a value per rank: every rank calls it together, after a fault they all saw."""
        comm = self.comm
        peaks = np.zeros(comm.size, dtype=np.float64)
        if self.x.numel():
            peaks[comm.rank] = float(torch.linalg.vector_norm(self.x, float("inf")))
        self.watchdog.allreduce(peaks, op=MPI.MAX, what="the search for the cause of non-finite values")
        r = int(np.argmax(peaks))
        path = f"{str(self.cfg.parts).rstrip('/')}/{part_name(r)}"
        if peaks[r] >= FLOAT32_SQUARE_LIMIT:
            more = int((peaks >= FLOAT32_SQUARE_LIMIT).sum()) - 1
            also = f", and those of {more} other rank(s) pass it too" if more else ""
            return (f"; the features in {path} (rank {r}) reach {peaks[r]:.3g}, beyond 2^64 = 1.8e19, too large "
                    f"for float32 training{also}: scale them")
        return (f"; the input features are moderate (at most {peaks[r]:.3g} in magnitude, in {path}): the values "
                "grew in training (too large a --lr?)")

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        self.model.eval()
        return self.model(self.x)

    def _if_better(self, accs: dict, best: dict, epoch: int) -> dict | None:
        """The model of ``epoch`` as a best-model candidate (accuracies and a copy of its parameters) when its
        validation accuracy beats ``best``'s, or always without validation nodes (the last one is kept); else
        None."""
        if accs["val_acc"] > best["val_acc"] or not self.split_sizes["val"]:
            return dict(val_acc=accs["val_acc"], epoch=epoch, accs=accs, state=copy.deepcopy(self.model.state_dict()))
        return None

    def _gather_epoch_figures(self, rec: dict) -> list | None:
        """Every rank's timings, bytes and memory of the epoch, on rank 0 (None elsewhere): one ``Gather`` of a
        fixed float64 row per rank (under the watchdog's deadline when it is active)."""
        mine = np.array([current_rss_bytes() if k == "rss_bytes" else np.nan if rec[k] is None else rec[k]
                         for k in EPOCH_FIGURES], dtype=np.float64)
        rows = np.empty((self.comm.size, len(EPOCH_FIGURES))) if self.comm.rank == 0 else None
        self.watchdog.gather(mine, rows, 0, "per-epoch metrics gather")
        if rows is None:
            return None
        return [{k: (int(v) if k in INT_FIGURES else None if np.isnan(v) else float(v))
                 for k, v in zip(EPOCH_FIGURES, row)} for row in rows]

    def timeline(self) -> dict | None:
        """The recorded epoch of every rank (:func:`g3mpi.comm.timeline.combine`) on rank 0, None on the others
        and when no epoch was recorded (every rank calls it: one text allgather under the watchdog)."""
        rec = self.recorder
        if rec is None or rec.epoch is None:
            return None
        texts = self.watchdog.allgather_text(json.dumps(rec.as_dict()), "timeline gather")
        if self.comm.rank != 0:
            return None
        cfg = self.cfg
        return combine([json.loads(t) for t in texts], epoch=rec.epoch, model=cfg.model, schedule=cfg.schedule,
                       sim_net=cfg.sim_net or None, world_size=self.comm.size)

    def _write_timeline(self, run_dir: Path) -> None:
        """RUN/timeline.json of the recorded epoch, if this run recorded one (``plot_run`` draws timeline.png)."""
        doc = self.timeline()
        if doc is not None:
            write_json_atomic(run_dir / TIMELINE, doc)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Global accuracies per split (counts reduced over ranks)."""
        pred = self.logits().argmax(dim=1)
        c = np.zeros(2 * len(SPLITS), dtype=np.int64)
        for i, s in enumerate(SPLITS):
            m = self.masks[s]
            c[2 * i] = int((pred[m] == self.y[m]).sum())
            c[2 * i + 1] = int(m.sum())
        self.watchdog.allreduce(c, what="evaluation")
        return {f"{s}_acc": (c[2 * i] / c[2 * i + 1]) if c[2 * i + 1] else float("nan") for i, s in enumerate(SPLITS)}

    def _stop_reason(self, signal_ranks: list) -> str:
        """What stopped the run, as the stop line names it: each stop signal that arrived, with the number of ranks
        it reached unless it reached all (``"SIGTERM"``, ``"SIGUSR1 on 1 of 4 ranks"``: signals reach the ranks
        at different moments, and this epoch's allreduce saw those that had arrived), else the time limit (each
        rank times it from its own start, a few milliseconds apart: it counts wherever some rank's clock passed
        it)."""
        size = self.comm.size
        said = [name if k == size else f"{name} on {k} of {size} ranks"
                for name, k in zip(STOP_SLOTS, signal_ranks) if k]
        if said:
            return " and ".join(said)
        return self.stop.limit_text if self.stop is not None else "the time limit"

    # -- the whole run ------------------------------------------------------------------------------------------
    def fit(self, run_dir: Path) -> dict:
        """Train from ``start_epoch`` to ``cfg.epochs`` (or early stopping), writing metrics.jsonl and checkpoints,
        then the best model's predictions, model.pt and summary.json. Returns the summary on rank 0, {} on the
        others. Stopped by a signal or the time limit (``stop``), it returns ``dict(stopped=True, epoch=E,
        reason=...)`` on every rank after writing the checkpoint of epoch E, and writes nothing else. Started from
        given parameters (:meth:`start_from`), it first evaluates them as epoch 0 (a metrics.jsonl line of
        accuracies); with ``cfg.epochs`` 0 that is the whole run, and its outputs come from them."""
        cfg, comm, rank = self.cfg, self.comm, self.comm.rank
        metrics = MetricsLog(run_dir / "metrics.jsonl") if rank == 0 else None
        bar = None
        if rank == 0 and cfg.progress:
            from tqdm import tqdm
            bar = tqdm(total=cfg.epochs, desc=f"g3-train {cfg.model} P={comm.size}", unit="epoch", leave=True)
        best = dict(val_acc=-1.0, epoch=0, state=None, accs={})
        since_best = 0
        last_loss = None
        if self.resumed is not None:
            r = self.resumed
            best = dict(val_acc=r["best"]["val_acc"], epoch=r["best"]["epoch"], state=r["best"]["state"],
                        accs=r["best"]["accs"])
            since_best, last_loss = r["since_best"], r["last_loss"]
            if bar is not None:
                bar.update(self.start_epoch - 1)
        epoch = self.start_epoch - 1
        last = None   # the evaluation after the last epoch when it is off the --eval-every grid, if better
        # resumed with nothing left to train (its outputs were never written: a full disk, a kill): only the outputs
        done = self.resumed is not None and (epoch >= cfg.epochs or bool(cfg.patience and since_best >= cfg.patience))
        if done and epoch == cfg.epochs and epoch % cfg.eval_every:   # the off-grid last evaluation, as it was
            last = self._if_better(self.evaluate(), best, epoch)
        if self.given and self.resumed is None:
            # given parameters (--init-from) are evaluated as epoch 0 and compete for the best model: a fine-tuning
            # that only lowers the validation accuracy keeps them (and with --epochs 0 that is all the run does)
            accs = self.evaluate()
            best = self._if_better(accs, best, 0) or best
            if rank == 0:
                metrics.write(dict(epoch=0, **accs))
        try:
            for epoch in range(self.start_epoch, epoch + 1 if done else cfg.epochs + 1):
                rec = self.train_step(epoch)
                last_loss = rec["loss"]
                accs = {}
                if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                    accs = self.evaluate()
                    this = self._if_better(accs, best, epoch)
                    if epoch % cfg.eval_every:
                        # off the grid: it competes for the outputs but stays out of the selection state that
                        # the checkpoint keeps, so a run resumed to more epochs selects as a straight run does
                        last = this
                    elif this is not None:
                        best, since_best = this, 0
                    else:
                        since_best += 1
                per_rank = self._gather_epoch_figures(rec)
                if rank == 0:
                    ep_time = max(r["epoch_time_s"] for r in per_rank)
                    sent = sum(r["bytes_sent"] for r in per_rank)
                    line = dict(epoch=epoch, loss=rec["loss"], epoch_time_s=ep_time, bytes_sent=sent,
                                bytes_recv=sum(r["bytes_recv"] for r in per_rank),
                                rank_compute_s=[r["compute_s"] for r in per_rank],
                                rank_blocked_s=[r["blocked_s"] for r in per_rank],
                                rank_comm_s=[r["comm_s"] for r in per_rank],
                                rank_overlap=[r["overlap"] for r in per_rank],
                                rank_allreduce_s=[r["allreduce_s"] for r in per_rank],
                                rank_bytes_sent=[r["bytes_sent"] for r in per_rank],
                                rank_bytes_recv=[r["bytes_recv"] for r in per_rank],
                                rank_messages=[r["messages"] for r in per_rank],
                                rank_rss_bytes=[r["rss_bytes"] for r in per_rank], **accs)
                    metrics.write(line)
                    if bar is not None:
                        post = dict(loss=f"{rec['loss']:.4f}")
                        if accs:
                            post.update(val=f"{accs['val_acc']:.3f}", best=f"{best['val_acc']:.3f}")
                        bar.set_postfix(post, refresh=False)
                        bar.update(1)
                stop = bool(cfg.patience and since_best >= cfg.patience)
                if (any(rec["signal_ranks"]) or rec["time_up_ranks"]) and epoch < cfg.epochs and not stop:
                    # a signal or the time limit on some rank: all stop here (an early stop in this epoch wins: the
                    # run ends with its outputs, as an unsignalled one does)
                    self.checkpoint(run_dir, epoch, best, since_best, last_loss)
                    reason = self._stop_reason(rec["signal_ranks"])
                    log.info("stopping after epoch %d: %s; checkpoint written", epoch, reason)
                    return dict(stopped=True, epoch=epoch, reason=reason)
                if cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0 and epoch != cfg.epochs and not stop:
                    self.checkpoint(run_dir, epoch, best, since_best, last_loss)
                if stop:
                    log.info("early stop at epoch %d: no better validation accuracy in %d evaluations",
                             epoch, cfg.patience)
                    break
            self.checkpoint(run_dir, epoch, best, since_best, last_loss)
        finally:
            if bar is not None:
                bar.close()
            if metrics is not None:
                metrics.close()
        best = last or best
        if best["state"] is not None:
            self.model.load_state_dict(best["state"])
        logits = self.logits().numpy()
        self.watchdog.context = f"after epoch {epoch}"
        write_predictions(comm, run_dir / "predictions.h5", self.part.orig_ids, logits, self.part.num_nodes,
                          attrs=dict(model=cfg.model, best_epoch=best["epoch"], partition_id=self.part.partition_id),
                          watchdog=self.watchdog, on_turn=lambda: self.hooks.stall_at("predictions"))
        peaks = np.empty(comm.size, dtype=np.int64) if rank == 0 else None
        self.watchdog.gather(np.array([peak_rss_bytes()], dtype=np.int64), peaks, 0, "peak memory gather")
        # with the other outputs of a finished run (a stopped one writes only its checkpoint)
        self._write_timeline(run_dir)
        if rank != 0:
            return {}
        save_state_dict(run_dir / "model.pt", self.model.state_dict())
        if cfg.plots:   # before summary.json: a run without its plots is not finished (--resume draws them)
            plot_run(run_dir, best_epoch=best["epoch"])
        # the timings of every epoch of the run, also those of the jobs before a --resume (metrics.jsonl)
        try:
            timings = run_timings(read_metrics(run_dir / "metrics.jsonl"))
        except OSError as e:   # written moments ago: only a vanished directory or a failing disk gets here
            log.warning("%s: cannot be read back for the summary's timings: %s", run_dir / "metrics.jsonl",
                        failure_reason(e))
            timings = run_timings([])
        exact = Schedule(cfg.schedule).communicates or comm.size == 1   # one rank has no halo for nocomm to skip
        summary = dict(
            model=cfg.model, world_size=comm.size, num_parts=self.meta["num_parts"],
            partition_method=self.meta.get("method"), num_nodes=self.part.num_nodes, num_edges=self.part.num_edges,
            epochs=epoch, best_epoch=best["epoch"], train_acc=best["accs"].get("train_acc"),
            val_acc=best["accs"].get("val_acc"), test_acc=best["accs"].get("test_acc"),
            final_loss=last_loss, **timings, peak_rss_bytes_max=int(peaks.max()), rank_peak_rss_bytes=peaks.tolist(),
            schedule=cfg.schedule, sim_net=cfg.sim_net or None, valid=exact, split_sizes=self.split_sizes)
        if not exact:
            summary["invalid_reason"] = "schedule nocomm skips the halo exchange: timings only, results are wrong"
        write_json_atomic(run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        """Free the halo exchanges and remove the gradient hooks from the model's parameters."""
        self.gradsync.close()
        self.ctx.free()


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


def _create_run_dir(cfg: TrainConfig, out: Path, lock: RunLock | None = None) -> None:
    if not cfg.out:
        raise ValueError("no run directory given (--out)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    if _occupied(out) and not cfg.force:   # (refused before the lock: nothing is written into another's directory)
        raise ValueError(f"{out}: run directory exists and is not empty (use --force to replace it)")
    out.mkdir(parents=True, exist_ok=True)  # runs/NAME works in a fresh directory, as the launchers' default
    if lock is not None:
        lock.acquire(out)
    if _occupied(out):   # looked at again under the lock: a run started at the same time may have written here
        if not cfg.force:
            raise ValueError(f"{out}: run directory exists and is not empty (use --force to replace it)")
        _check_replaceable(out)
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
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
    was this job's allocation (a resumed run gets its own from its launcher, G3_TIMEOUT, or ``--time-limit``)."""
    return to_toml(cfg.replace(parts=str(Path(cfg.parts).resolve()), force=False, time_limit=0.0,
                               init_from=str(Path(cfg.init_from).resolve()) if cfg.init_from else ""))
