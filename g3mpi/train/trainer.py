"""Full-graph distributed training on one rank's part: the loop, evaluation, early stopping, the outputs.

Loss = sum over this rank's training nodes / number of training nodes in the whole graph (multilabel: known
entries; :mod:`.tasks` has the loss and the metrics of each task), so the sum over ranks is the single-process mean
and the allreduced (summed) parameter gradients equal single-process ones.
Parameters are replicated (same seed, same initialisation on every rank); every rank steps its own optimiser on
identical gradients. Node embeddings (``--node-embedding``) are not: each rank holds and steps its owned rows,
checkpointed as per-rank shards (:mod:`.checkpoint`) and written to RUN/embeddings.h5 by original node ID. What comes before (loading, the start-up checks, the run directory) is :mod:`.startup` and
:mod:`.rundir`.
"""
from __future__ import annotations

import copy
import json
import logging
import sys
import time
import uuid
from functools import partial
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.comm import CommContext, SimNet
from g3mpi.comm.timeline import Recorder, clock_offset, combine
from g3mpi.mpi.watchdog import Watchdog
from g3mpi.format.errors import failure_reason
from g3mpi.format.features import widen
from g3mpi.format.limits import FLOAT32_SQUARE_LIMIT
from g3mpi.format.partition import part_name, read_part_edges
from g3mpi.nn import EmbeddingInput, NodeEmbedding, build_model, replicated_state, sharded_parameters, specs
from g3mpi.ops import DistGraph, DropoutKey
from g3mpi.ops.precision import autocast, warn_if_slow
from g3mpi.sched import Schedule

from .checkpoint import CHECKPOINT_NAME, make_checkpoint, prune_shards, save_checkpoint, save_shard, shard_path, \
    split_shard
from .config import TrainConfig
from .optim import SGD, Adam
from .phases import Phases
from .faults import TestHooks, TrainingFault, first_nonfinite
from .gradsync import GradSync, param_buckets
from .choices import HITS, SUFFIX
from .plots import plot_run
from .rundir import EMBEDDINGS, SPLITS, TIMELINE, MetricsLog, OutputError, read_metrics, run_timings, \
    save_state_dict, write_embeddings, write_json_atomic, write_link_predictions, write_predictions
from g3mpi.mpi.stop import STOP_SLOTS
from .sysmem import current_rss_bytes, peak_rss_bytes
from .link import LinkModel, LinkTask, build_decoder
from .tasks import evaluate, loss_sum, loss_terms, output_dim, predict
from .userfile import build_user_model, check_output

log = logging.getLogger("g3mpi.train")
#: what each rank reports to rank 0 after every epoch (metrics.jsonl's rank_* lists), integers in INT_FIGURES
EPOCH_FIGURES = ("compute_s", "blocked_s", "comm_s", "overlap", "allreduce_s", "bytes_sent", "bytes_recv", "messages",
                 "epoch_time_s", "rss_bytes")
INT_FIGURES = ("bytes_sent", "bytes_recv", "messages", "rss_bytes")


def _no_mark(phase: str) -> None:
    """The phase mark of an epoch that is not recorded."""


def _reload_edges(parts: str, part):
    """The part's local CSR read again for a form built after it was dropped (``DistGraph.release_edges``)."""
    log.info("reading the local CSR of part %d again from %s (a form first needed now)", part.part_id, parts)
    return read_part_edges(parts, part)


class Trainer:
    """Owns one rank's graph view, model and optimiser. ``comm`` is injected; every rank calls the same methods."""

    def __init__(self, cfg: TrainConfig, comm, part, meta: dict, split_sizes: dict, stop=None,
                 watchdog: Watchdog | None = None, hooks: TestHooks | None = None, release_edges: bool = True):
        """``split_sizes``: the training, validation and test nodes of the whole graph
        (:func:`g3mpi.train.startup.start_up_sums`, which every caller runs before building a model). ``stop``: a
        :class:`~g3mpi.mpi.stop.StopSignals` (or anything with a ``received`` attribute): when set on any rank,
        :meth:`fit` stops after the current epoch with a checkpoint. ``watchdog`` (on ``comm``, with
        ``cfg.comm_timeout``) and ``hooks`` are the caller's when it has them (g3-train's start-up uses them too),
        else made here. ``release_edges``: drop the part's local CSR after the first training forward (the forms
        the layers use are built by then; one made later reads it again from ``cfg.parts``)."""
        self.cfg, self.comm, self.part, self.meta = cfg, comm, part, meta
        self.stop = stop
        #: this rank's start-up phases (:class:`~.phases.Phases`), which g3-train sets: summary.json's "startup"
        self.startup = None
        torch.set_num_threads(cfg.threads)
        simnet = SimNet.from_spec(cfg.sim_net) if cfg.sim_net else None
        self.watchdog = watchdog or Watchdog(comm, cfg.comm_timeout, prog="g3-train", floor=cfg.comm_timeout_floor,
                                             factor=cfg.comm_timeout_factor)
        self.hooks = hooks or TestHooks.from_env(comm.rank)
        # the epoch whose timeline is recorded (0: none); the clock offsets are estimated only then
        self.timeline_epoch = min(cfg.timeline_epoch, cfg.epochs)
        self.recorder = Recorder(comm.rank, *clock_offset(self.watchdog)) if self.timeline_epoch > 0 else None
        self.ctx = CommContext(comm, simnet, watchdog=self.watchdog if self.watchdog.active else None,
                               recorder=self.recorder, halo_dtype=cfg.halo_dtype)
        warn_if_slow(cfg.precision, comm.rank)
        self.graph = DistGraph(part, self.ctx, Schedule(cfg.schedule, cfg.chunk_rows),
                               reload_edges=partial(_reload_edges, cfg.parts, part) if release_edges else None)
        self._edges_kept = True
        torch.manual_seed(cfg.seed)
        # link prediction: the model embeds nodes (cfg.embed_dim wide), a decoder scores pairs (.link)
        self.out_dim = cfg.embed_dim if cfg.task == "link" else output_dim(cfg.task, part.num_classes)
        #: the model has a parameter-free product of its input to keep (the registry's rule)
        self.input_cache_applies = specs.input_cache_applies(cfg, part.feature_dim, self.out_dim)
        self.link = None
        try:
            self.model = self._build_model(part.feature_dim, self.out_dim)
            if cfg.task == "link":
                self.model = LinkModel(self.model, build_decoder(cfg, part.num_relations))
                self.link = LinkTask(self.graph, part, cfg, self.watchdog)
        except Exception:
            self.ctx.free()     # (the exchanges the model's layers planned so far)
            raise
        self.named_params = list(self.model.named_parameters())
        self.params = [p for _, p in self.named_params]
        #: the sharded parameters (node embeddings: this rank's rows) by name -> index among the optimiser's
        self.sharded = {k: i for i, (k, _) in enumerate(self.named_params) if k in sharded_parameters(self.model)}
        if cfg.optimizer == "adam":
            self.opt = Adam(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        else:
            self.opt = SGD(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum)
        self.x = torch.from_numpy(widen(part.features, part.feature_dtype))   # float16/bfloat16 stored: exact
        if cfg.precision == "bf16-mixed" and not cfg.model_file:
            # the first product rounds its input to bfloat16 anyway: kept so, the input and layer 0's
            # aggregate of it take half the bytes (a user's model file gets float32 input, as autocast expects)
            self.x = self.x.to(torch.bfloat16)
        #: bytes this rank sent once to fetch its neighbours' input halo rows (0 when the model keeps none)
        self.input_halo_bytes = 0
        if self.keeps_input_halo:   # fetched once as stored; the first layer then sends nothing (GNN)
            sent = self.ctx.stats.bytes_sent
            self.model.keep_input_halo(self.x, self.graph.halo_rows(part.features, "input"), part.feature_dtype)
            self.input_halo_bytes = self.ctx.stats.bytes_sent - sent
        if part.feature_dtype != "float32" or self.x.dtype != torch.float32:
            part.features = None        # the stored copy: only self.x is used from here on
        self.y = torch.from_numpy(part.labels)
        self.masks = {s: torch.from_numpy(getattr(part, f"{s}_mask")) for s in SPLITS}
        # (link: the pairs of each split)
        self.split_sizes = dict(split_sizes) if self.link is None else dict(self.link.split_sizes)
        if self.split_sizes["train"] == 0:
            raise ValueError(f"{cfg.parts}: the graph has no training {'pairs' if self.link else 'nodes'}")
        #: the validation metric that selects the best epoch (metrics.jsonl's and the summary's key)
        self.score_key = f"val_{SUFFIX[cfg.metric]}"
        if self.split_sizes["val"] == 0 and comm.rank == 0:
            log.warning("%s: no validation nodes or pairs: the model of the last evaluated epoch is kept%s", cfg.parts,
                        ", and --patience is ignored" if cfg.patience else "")
        # gradients summed over ranks layer by layer during backward (last layer first), overlapped with it; the
        # parameters outside the layers (recipe linears and norms, a user module's own) in a last bucket
        self.gradsync = GradSync(comm, param_buckets(self.model), self.watchdog)
        # the loss, the numbers of ranks with a non-finite loss / gradient, past the time limit, and with each stop
        # signal (STOP_SLOTS)
        self._flags = np.zeros(4 + len(STOP_SLOTS), dtype=np.float64)
        self._said_undefined = False   # the warning about an undefined validation metric, once
        self.start_epoch = 1
        self.resumed = None   # the checkpoint this trainer continues from, if any
        self.given = False    # started from given parameters (start_from)
        # the loss's denominator: the training nodes of the whole graph, or (multilabel) their known entries, a
        # sum over the ranks (last in the constructor: a rank that failed above never reaches it, and aborts)
        self.loss_terms = self.split_sizes["train"] if self.link is None else self.link.loss_terms
        if cfg.task == "multilabel":
            n = np.array([loss_terms(cfg.task, part.labels, part.train_mask)], dtype=np.int64)
            self.watchdog.allreduce(n, what="the loss's denominator")
            self.loss_terms = int(n[0])

    @property
    def keeps_input_halo(self) -> bool:
        """The model keeps its input's halo rows (``GNN.keep_input_halo``): a built-in stack whose first layer
        aggregates the raw input, with the input cache on, on host tensors. The same on every rank."""
        return bool(self.cfg.input_cache and self.input_cache_applies and self.graph.stager is None)

    def _build_model(self, in_dim: int, out_dim: int) -> torch.nn.Module:
        """The built-in stack of ``cfg.model``, or the user's module of ``cfg.model_file``
        (:class:`~.userfile.ModelFileError` when that fails); with ``cfg.node_embedding``, on the learned node
        embeddings and the features (``g3mpi.nn.EmbeddingInput``)."""
        cfg = self.cfg
        dim = cfg.node_embedding
        if dim:   # (the inner model takes [embedding | features])
            in_dim += dim
        if cfg.model_file:
            model = build_user_model(cfg.model_file, self.graph, in_dim, out_dim, cfg)
        else:
            model = build_model(self.graph, cfg, in_dim, out_dim)
        if dim:
            model = EmbeddingInput(NodeEmbedding(self.graph, dim, cfg.seed), model, concat=in_dim > dim)
        return model

    def check_model_output(self) -> None:
        """A user's model: one evaluation pass, whose output must be [owned nodes, out_dim]
        (:class:`~.userfile.ModelFileError` otherwise). Every rank calls it together."""
        if self.cfg.model_file:
            check_output(self.cfg.model_file, self.model, self.x, self.out_dim)

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
        """Rank 0 writes RUN/checkpoint.pt atomically, after every rank has written its shard of the node
        embeddings, if the model has any (:mod:`.checkpoint`); a failure stops every rank (TrainingFault)."""
        self.watchdog.context = f"epoch {epoch}"
        self.hooks.stall_at("checkpoint")
        model, optimizer, best_state = self.model.state_dict(), self.opt.state_dict(), best["state"]
        shards, err = None, None
        if self.sharded:
            # a fresh tag per checkpoint: the shards the current checkpoint.pt names are never overwritten
            tag = self.watchdog.allgather_text(uuid.uuid4().hex[:16] if self.comm.rank == 0 else None,
                                               "checkpoint shard tag")[0]
            shards = dict(tag=tag, num_parts=self.comm.size)
            model, optimizer, best_state, mine = split_shard(model, optimizer, best_state, self.sharded)
            path = shard_path(run_dir, tag, self.comm.rank)
            try:
                save_shard(path, self.comm.rank, self.part.orig_ids, mine)
            except Exception as e:  # noqa: BLE001 - reported on every rank
                err = f"{path}: writing this rank's checkpoint shard failed: {failure_reason(e)}"
            failed = np.array([1.0 if err else 0.0])
            self.watchdog.allreduce(failed, what="checkpoint shards (every rank writes its own)")
            if failed[0]:
                raise TrainingFault(err or f"stopping: {int(failed[0])} rank(s) could not write a checkpoint shard")
        if self.comm.rank == 0:
            try:
                save_checkpoint(run_dir / CHECKPOINT_NAME, make_checkpoint(
                    epoch=epoch, model=model, optimizer=optimizer, best=dict(best, state=best_state),
                    since_best=since_best, last_loss=last_loss, cfg=self.cfg, meta=self.meta, shards=shards))
                if shards is not None:   # (the checkpoint in place names the new tag: the older ones can go)
                    prune_shards(run_dir, shards["tag"])
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
        with autocast(self.cfg.precision):
            logits = self.model(self.x, DropoutKey(self.cfg.seed, epoch)).float()
        if self._edges_kept:    # (4 bytes an edge from here on, backward's peak included)
            self._edges_kept = not self.graph.release_edges()
        mark("loss")
        if self.link is not None:   # (logits: the node embeddings; the pairs' exchange is planned per epoch)
            loss = self.link.loss_sum(logits, self.model.decoder, epoch) / max(self.loss_terms, 1)
        else:
            loss = loss_sum(self.cfg.task, logits, self.y, self.masks["train"]) / max(self.loss_terms, 1)
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
        with autocast(self.cfg.precision):
            return self.model(self.x).float()

    def _if_better(self, accs: dict, best: dict, epoch: int) -> dict | None:
        """The model of ``epoch`` as a best-model candidate (metrics and a copy of its parameters) when its
        validation metric (``cfg.metric``) beats ``best``'s, or always without validation nodes (the last one is
        kept); else None. An undefined metric (NaN: a ROC-AUC of a split with one class) never beats a defined
        one; while none was defined the last evaluated model is kept, as without validation nodes (a warning
        says so once)."""
        score = accs[self.score_key]
        undefined = best["score"] is None or not best["score"] >= 0     # (NaN, or no evaluation yet: -1)
        if score != score and not self._said_undefined:
            self._said_undefined = True
            if self.comm.rank == 0:
                log.warning("val %s is undefined at epoch %d (e.g. the validation split has one class only): "
                            "until it is defined, the model of the last evaluated epoch is kept and --patience "
                            "counts nothing", self.cfg.metric, epoch)
        if score > best["score"] or not self.split_sizes["val"] or undefined:
            return dict(score=score, epoch=epoch, accs=accs, state=copy.deepcopy(self.model.state_dict()))
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
        return combine([json.loads(t) for t in texts], epoch=rec.epoch, model=cfg.model_label, schedule=cfg.schedule,
                       sim_net=cfg.sim_net or None, world_size=self.comm.size)

    def _write_timeline(self, run_dir: Path) -> None:
        """RUN/timeline.json of the recorded epoch, if this run recorded one (``plot_run`` draws timeline.png)."""
        doc = self.timeline()
        if doc is not None:
            write_json_atomic(run_dir / TIMELINE, doc)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Global accuracies per split, and the values of ``cfg.metric`` (:func:`.tasks.evaluate`; link: the
        metric of the val and test pairs, :class:`.link.LinkTask`)."""
        if self.link is not None:
            return self.link.evaluate(self.logits(), self.model.decoder, self.cfg.metric)
        return evaluate(self.cfg.task, self.cfg.metric, self.logits().numpy(), self.part.labels,
                        {s: self.masks[s].numpy() for s in SPLITS}, self.watchdog)

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
        cfg = self.cfg
        metrics = MetricsLog(run_dir / "metrics.jsonl") if self.comm.rank == 0 else None
        bar = self._progress_bar()
        sel = _Selection(self.resumed)
        epoch = self.start_epoch - 1
        # resumed with nothing left to train (its outputs were never written: a full disk, a kill): only the outputs
        done = self.resumed is not None and (epoch >= cfg.epochs or self._patience_spent(sel))
        if done and epoch == cfg.epochs and epoch % cfg.eval_every:   # the off-grid last evaluation, as it was
            sel.last = self._if_better(self.evaluate(), sel.best, epoch)
        if self.given and self.resumed is None:
            # given parameters (--init-from) are evaluated as epoch 0 and compete for the best model: a fine-tuning
            # that only lowers the validation accuracy keeps them (and with --epochs 0 that is all the run does)
            accs = self.evaluate()
            sel.best = self._if_better(accs, sel.best, 0) or sel.best
            if metrics is not None:
                metrics.write(dict(epoch=0, **accs))
        try:
            epoch, stopped = self._train_epochs(run_dir, sel, metrics, bar, epoch if done else cfg.epochs)
            if stopped is not None:
                return stopped
            self.checkpoint(run_dir, epoch, sel.best, sel.since_best, sel.last_loss)
        finally:
            if bar is not None:
                bar.close()
            if metrics is not None:
                metrics.close()
        return self._write_outputs(run_dir, epoch, sel)

    def _progress_bar(self):
        """Rank 0's progress bar, at the resumed epoch; None elsewhere, and where ``cfg.progress`` is off or auto
        with stderr not a terminal (a batch job's log would fill with bar redraws)."""
        if self.comm.rank != 0 or not show_progress(self.cfg.progress, sys.stderr):
            return None
        from tqdm import tqdm
        bar = tqdm(total=self.cfg.epochs, desc=f"g3-train {self.cfg.model_label} P={self.comm.size}", unit="epoch",
                   leave=True)
        if self.resumed is not None:
            bar.update(self.start_epoch - 1)
        return bar

    def _patience_spent(self, sel: "_Selection") -> bool:
        return bool(self.cfg.patience and sel.since_best >= self.cfg.patience)

    def _train_epochs(self, run_dir: Path, sel: "_Selection", metrics, bar, end: int) -> tuple[int, dict | None]:
        """Epochs ``start_epoch`` .. ``end`` (fewer on an early stop): (the last epoch trained, or ``start_epoch -
        1`` for none; None, or the result of :meth:`fit` when a signal or the time limit stopped the run)."""
        cfg = self.cfg
        epoch = self.start_epoch - 1
        for epoch in range(self.start_epoch, end + 1):
            t_epoch = time.perf_counter()
            rec = self.train_step(epoch)
            sel.last_loss = rec["loss"]
            accs = self._evaluate_epoch(epoch, sel)
            per_rank = self._gather_epoch_figures(rec)
            if self.comm.rank == 0:
                metrics.write(self._metrics_line(epoch, rec, per_rank, accs))
                if bar is not None:
                    post = dict(loss=f"{rec['loss']:.4f}")
                    if accs:
                        post.update(val=f"{accs[self.score_key]:.3f}", best=f"{sel.best['score']:.3f}")
                    bar.set_postfix(post, refresh=False)
                    bar.update(1)
            stop = self._patience_spent(sel)
            if (any(rec["signal_ranks"]) or rec["time_up_ranks"]) and epoch < cfg.epochs and not stop:
                # a signal or the time limit on some rank: all stop here (an early stop in this epoch wins: the
                # run ends with its outputs, as an unsignalled one does)
                self.checkpoint(run_dir, epoch, sel.best, sel.since_best, sel.last_loss)
                reason = self._stop_reason(rec["signal_ranks"])
                log.info("stopping after epoch %d: %s; checkpoint written", epoch, reason)
                return epoch, dict(stopped=True, epoch=epoch, reason=reason)
            if cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0 and epoch != cfg.epochs and not stop:
                self.checkpoint(run_dir, epoch, sel.best, sel.since_best, sel.last_loss)
            # the adaptive deadline follows the slowest epoch, with its evaluation, metrics and checkpoint
            self.watchdog.step_done(time.perf_counter() - t_epoch)
            if stop:
                log.info("early stop at epoch %d: no better validation %s in %d evaluations",
                         epoch, cfg.metric, cfg.patience)
                break
        return epoch, None

    def _evaluate_epoch(self, epoch: int, sel: "_Selection") -> dict:
        """The accuracies after ``epoch`` when it is evaluated (every ``eval_every`` epochs and the last), else {};
        the model selection ``sel`` updated."""
        cfg = self.cfg
        if epoch % cfg.eval_every and epoch != cfg.epochs:
            return {}
        self.watchdog.context = f"epoch {epoch}, evaluation"
        self.hooks.stall_at("evaluation")
        accs = self.evaluate()
        this = self._if_better(accs, sel.best, epoch)
        if epoch % cfg.eval_every:
            # off the grid: it competes for the outputs but stays out of the selection state that the checkpoint
            # keeps, so a run resumed to more epochs selects as a straight run does
            sel.last = this
        elif this is not None:
            sel.best, sel.since_best = this, 0
        else:
            sel.since_best += 1
        return accs

    @staticmethod
    def _metrics_line(epoch: int, rec: dict, per_rank: list, accs: dict) -> dict:
        """metrics.jsonl's record of an epoch: the loss, the slowest rank's time, every rank's figures."""
        return dict(epoch=epoch, loss=rec["loss"], epoch_time_s=max(r["epoch_time_s"] for r in per_rank),
                    bytes_sent=sum(r["bytes_sent"] for r in per_rank),
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

    def _write_outputs(self, run_dir: Path, epoch: int, sel: "_Selection") -> dict:
        """The outputs of a finished run from its best model: predictions.h5 (every rank its rows), the timeline,
        then on rank 0 model.pt, the plots and summary.json. Returns the summary on rank 0, {} elsewhere."""
        cfg, comm = self.cfg, self.comm
        shutdown = Phases()
        best = sel.last or sel.best
        if best["state"] is not None:
            self.model.load_state_dict(best["state"])
        logits = self.logits().numpy()
        self.watchdog.context = f"after epoch {epoch}"
        if self.link is not None:
            self._write_link_predictions(run_dir, best)
        else:
            write_predictions(comm, run_dir / "predictions.h5", self.part.orig_ids, logits, self.part.num_nodes,
                              pred=predict(cfg.task, logits),
                              attrs=dict(model=cfg.model_label, best_epoch=best["epoch"],
                                         num_classes=self.part.num_classes, partition_id=self.part.partition_id,
                                         task=cfg.task),
                              watchdog=self.watchdog, on_turn=lambda: self.hooks.stall_at("predictions"))
        shutdown.mark("predictions")
        if self.sharded:
            self._write_embeddings(run_dir, best)
            shutdown.mark("embeddings")
        startup = self.startup.seconds if self.startup is not None else {}
        mine = np.array([peak_rss_bytes(), self.input_halo_bytes, *(round(v * 1e6) for v in startup.values())],
                        dtype=np.int64)
        got = np.empty((comm.size, mine.size), dtype=np.int64) if comm.rank == 0 else None
        self.watchdog.gather(mine, got, 0, "peak memory and start-up gather")
        # with the other outputs of a finished run (a stopped one writes only its checkpoint)
        self._write_timeline(run_dir)
        shutdown.mark("timeline")
        if cfg.plots:   # before summary.json: a run without its plots is not finished (--resume draws them)
            self._plot(run_dir, best["epoch"])
            shutdown.mark("plots")
        if comm.rank != 0:
            return {}
        # (the replicated parameters: the node embeddings are every rank's own rows)
        save_state_dict(run_dir / "model.pt", replicated_state(self.model))
        shutdown.mark("model")
        summary = self._summary(run_dir, epoch, best, sel.last_loss, got[:, 0])
        summary["input_halo_bytes"] = int(got[:, 1].sum())
        # each start-up phase as long as the slowest rank's (what the job waited for), then rank 0's shut-down
        slowest = got[:, 2:].max(axis=0) / 1e6
        summary["startup"] = Phases.of(dict(zip(startup, slowest.tolist()))).rounded()
        summary["shutdown"] = shutdown.rounded()
        write_json_atomic(run_dir / "summary.json", summary)
        return summary

    def _write_embeddings(self, run_dir: Path, best: dict) -> None:
        """RUN/embeddings.h5: the best model's node-embedding tables by original node ID, every rank its rows
        (dataset ``embedding``, or with several tables each one's module name)."""
        params = dict(self.named_params)
        names = {k: ("embedding" if len(self.sharded) == 1 else k.removesuffix(".weight")) for k in self.sharded}
        write_embeddings(self.comm, run_dir / EMBEDDINGS, self.part.orig_ids,
                         {names[k]: params[k].detach().cpu().numpy() for k in self.sharded}, self.part.num_nodes,
                         attrs=dict(model=self.cfg.model_label, best_epoch=best["epoch"],
                                    partition_id=self.part.partition_id, parameters=list(self.sharded)),
                         watchdog=self.watchdog, on_turn=lambda: self.hooks.stall_at("predictions"))

    def _write_link_predictions(self, run_dir: Path, best: dict) -> None:
        """predictions.h5 of a link run: the scores of the val and test pairs by original node IDs
        (:meth:`.link.LinkTask.prediction_rows`), every rank its pairs."""
        cfg, link = self.cfg, self.link
        with torch.no_grad():
            scores = link.scores(self.logits(), self.model.decoder)
        write_link_predictions(self.comm, run_dir / "predictions.h5", link.prediction_rows(scores, self.part.orig_ids),
                               attrs=dict(model=cfg.model_label, best_epoch=best["epoch"], decoder=cfg.decoder,
                                          partition_id=self.part.partition_id, task=cfg.task),
                               watchdog=self.watchdog, on_turn=lambda: self.hooks.stall_at("predictions"))

    def _plot(self, run_dir: Path, best_epoch: int) -> None:
        """The plots, drawn side by side: rank r draws plot r, r + P, ... (:func:`plot_run`'s share), so that the
        run does not end waiting for rank 0 to draw them all. A plot that could not be written: OutputError on
        rank 0 (which ends the job) naming it."""
        err = None
        self.watchdog.barrier("plots (rank 0 has written timeline.json)")
        try:
            plot_run(run_dir, best_epoch=best_epoch, share=(self.comm.rank, self.comm.size),
                     metric=self.cfg.metric)
        except OutputError as e:
            err = str(e)
        errs = self.watchdog.allgather_text(err, "plots")
        if self.comm.rank == 0 and any(e is not None for e in errs):
            raise OutputError(next(e for e in errs if e is not None))

    def _summary(self, run_dir: Path, epoch: int, best: dict, last_loss, peaks: np.ndarray) -> dict:
        """summary.json of a finished run (rank 0)."""
        cfg, comm = self.cfg, self.comm
        # the timings of every epoch of the run, also those of the jobs before a --resume (metrics.jsonl)
        try:
            timings = run_timings(read_metrics(run_dir / "metrics.jsonl"))
        except OSError as e:   # written moments ago: only a vanished directory or a failing disk gets here
            log.warning("%s: cannot be read back for the summary's timings: %s", run_dir / "metrics.jsonl",
                        failure_reason(e))
            timings = run_timings([])
        exact = Schedule(cfg.schedule).communicates or comm.size == 1   # one rank has no halo for nocomm to skip
        # the chosen metric's values (accuracy's keys stay as they were for every task: the tools read them)
        keys = [f"{s}_{SUFFIX[cfg.metric]}" for s in ("test", "val", "train")] if cfg.metric != "accuracy" else []
        if self.link is not None and self.link.kg:   # (filtered ranking: MRR with Hits@1/3/10 alike)
            keys += [k for k in best["accs"] if k not in keys and k.split("_", 1)[1] in ("mrr", *HITS)]
        summary = dict(
            metric=cfg.metric, **{k: best["accs"].get(k) for k in keys}, task=cfg.task, model=cfg.model_label,
            world_size=comm.size, num_parts=self.meta["num_parts"],
            partition_method=self.meta.get("method"), num_nodes=self.part.num_nodes, num_edges=self.part.num_edges,
            epochs=epoch, best_epoch=best["epoch"], train_acc=best["accs"].get("train_acc"),
            val_acc=best["accs"].get("val_acc"), test_acc=best["accs"].get("test_acc"),
            final_loss=last_loss, **timings, peak_rss_bytes_max=int(peaks.max()), rank_peak_rss_bytes=peaks.tolist(),
            schedule=cfg.schedule, sim_net=cfg.sim_net or None, valid=exact, split_sizes=self.split_sizes)
        if not exact:
            summary["invalid_reason"] = "schedule nocomm skips the halo exchange: timings only, results are wrong"
        return summary

    # -- what the bench reads and switches -------------------------------------------------------------------------
    def use_schedule(self, mode: str) -> None:
        """Run the passes from now on under the schedule ``mode`` (of ``g3mpi.sched.MODES``), same chunk rule: the
        bench's variants of one design share one trainer."""
        self.graph.schedule = Schedule(mode, self.cfg.chunk_rows)

    def close(self) -> None:
        """Free the halo exchanges and remove the gradient hooks from the model's parameters."""
        self.gradsync.close()
        if self.link is not None:
            self.link.free()
        self.ctx.free()


def show_progress(setting: str, stream) -> bool:
    """Whether the progress bar is drawn on ``stream``: ``setting`` (``cfg.progress``) on, or auto with ``stream``
    a terminal (a batch job's log filled with the bar's redraws)."""
    return setting == "on" or setting == "auto" and bool(getattr(stream, "isatty", lambda: False)())


class _Selection:
    """The best-model selection of a run: the best evaluation on the ``--eval-every`` grid (its validation score,
    metrics, epoch, a copy of the parameters), the evaluations since it, the last loss (what a checkpoint keeps,
    restored from ``resumed``), and the off-grid last evaluation when it beat the best (``last``, which the outputs
    prefer)."""

    def __init__(self, resumed: dict | None = None):
        self.best = dict(score=-1.0, epoch=0, state=None, accs={})
        self.since_best, self.last_loss, self.last = 0, None, None
        if resumed is not None:
            b = resumed["best"]
            self.best = dict(score=b["val_acc"], epoch=b["epoch"], state=b["state"], accs=b["accs"])
            self.since_best, self.last_loss = resumed["since_best"], resumed["last_loss"]
