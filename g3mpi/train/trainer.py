"""Full-graph distributed training on one rank's part: the loop, evaluation, early stopping, the run directory.

Loss = sum over this rank's training nodes / number of training nodes in the whole graph, so the sum over
ranks is the single-process mean and the allreduced (summed) parameter gradients equal single-process ones.
Parameters are replicated (same seed, same initialisation on every rank); every rank steps its own optimiser on
identical gradients.
"""
from __future__ import annotations

import copy
import logging
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from g3mpi.comm import CommContext, SimNet
from g3mpi.nn import GNN
from g3mpi.ops import DistGraph, DropoutKey
from g3mpi.sched import Schedule

from .config import TrainConfig, to_toml
from .rundir import MetricsLog, save_state_dict, write_json_atomic, write_predictions, write_text_atomic

log = logging.getLogger("g3mpi.train")
SPLITS = ("train", "val", "test")


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class Trainer:
    """Owns one rank's graph view, model and optimiser. ``comm`` is injected; every rank calls the same methods."""

    def __init__(self, cfg: TrainConfig, comm, part, meta: dict):
        self.cfg, self.comm, self.part, self.meta = cfg, comm, part, meta
        torch.set_num_threads(cfg.threads)
        simnet = SimNet.from_spec(cfg.sim_net) if cfg.sim_net else None
        self.ctx = CommContext(comm, simnet)
        self.graph = DistGraph(part, self.ctx, Schedule(cfg.schedule, cfg.chunk_rows))
        torch.manual_seed(cfg.seed)
        self.model = GNN(self.graph, cfg.model, part.feature_dim, cfg.hidden, part.num_classes, layers=cfg.layers,
                         heads=cfg.heads, out_heads=cfg.out_heads, dropout=cfg.dropout,
                         attn_dropout=cfg.attn_dropout, activation=cfg.activation)
        self.params = [p for p in self.model.parameters()]
        if cfg.optimizer == "adam":
            self.opt = torch.optim.Adam(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        else:
            self.opt = torch.optim.SGD(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum)
        self.x = torch.from_numpy(part.features)
        self.y = torch.from_numpy(part.labels)
        self.masks = {s: torch.from_numpy(getattr(part, f"{s}_mask")) for s in SPLITS}
        counts = np.array([int(self.masks[s].sum()) for s in SPLITS], dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, counts)
        self.split_sizes = dict(zip(SPLITS, counts.tolist()))
        if self.split_sizes["train"] == 0:
            raise ValueError(f"{cfg.parts}: the graph has no training nodes")
        self._gradbuf = torch.zeros(sum(p.numel() for p in self.params) + 1, dtype=torch.float32)

    # -- one epoch ----------------------------------------------------------------------------------------------
    def train_step(self, epoch: int) -> dict:
        """Forward, backward, gradient allreduce, optimiser step. Returns the global loss and this rank's timings."""
        stats = self.ctx.stats
        stats.reset()
        t0 = time.perf_counter()
        self.model.train()
        self.opt.zero_grad(set_to_none=False)
        logits = self.model(self.x, DropoutKey(self.cfg.seed, epoch))
        m = self.masks["train"]
        loss = F.cross_entropy(logits[m], self.y[m], reduction="sum") / self.split_sizes["train"]
        loss.backward()
        t_ar = time.perf_counter()
        buf, off = self._gradbuf, 0
        for p in self.params:
            n = p.numel()
            buf[off:off + n] = p.grad.reshape(-1)
            off += n
        buf[off] = loss.detach()
        self.comm.Allreduce(MPI.IN_PLACE, buf.numpy())
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(buf[off:off + n].view_as(p))
            off += n
        allreduce_s = time.perf_counter() - t_ar
        self.opt.step()
        dt = time.perf_counter() - t0
        s = stats.as_dict()
        return dict(loss=float(buf[off]), epoch_time_s=dt, compute_s=dt - s["blocked_s"] - allreduce_s,
                    blocked_s=s["blocked_s"], comm_s=s["comm_s"], overlap=s["overlap"], allreduce_s=allreduce_s,
                    bytes_sent=s["bytes_sent"], bytes_recv=s["bytes_recv"], messages=s["messages_sent"])

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        self.model.eval()
        return self.model(self.x)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Global accuracies per split (counts reduced over ranks)."""
        pred = self.logits().argmax(dim=1)
        c = np.zeros(2 * len(SPLITS), dtype=np.int64)
        for i, s in enumerate(SPLITS):
            m = self.masks[s]
            c[2 * i] = int((pred[m] == self.y[m]).sum())
            c[2 * i + 1] = int(m.sum())
        self.comm.Allreduce(MPI.IN_PLACE, c)
        return {f"{s}_acc": (c[2 * i] / c[2 * i + 1]) if c[2 * i + 1] else float("nan") for i, s in enumerate(SPLITS)}

    # -- the whole run ------------------------------------------------------------------------------------------
    def fit(self, run_dir: Path) -> dict:
        cfg, comm, rank = self.cfg, self.comm, self.comm.rank
        metrics = MetricsLog(run_dir / "metrics.jsonl") if rank == 0 else None
        bar = None
        if rank == 0 and cfg.progress:
            from tqdm import tqdm
            bar = tqdm(total=cfg.epochs, desc=f"g3-train {cfg.model} P={comm.size}", unit="epoch", leave=True)
        best = dict(val_acc=-1.0, epoch=0, state=None, accs={})
        since_best = 0
        times, bytes_all, overlaps, compute, blocked = [], [], [], [], []
        epoch = 0
        try:
            for epoch in range(1, cfg.epochs + 1):
                rec = self.train_step(epoch)
                accs = {}
                if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                    accs = self.evaluate()
                    if accs["val_acc"] > best["val_acc"]:
                        best = dict(val_acc=accs["val_acc"], epoch=epoch, accs=accs,
                                    state=copy.deepcopy(self.model.state_dict()))
                        since_best = 0
                    else:
                        since_best += 1
                per_rank = comm.gather({k: rec[k] for k in ("compute_s", "blocked_s", "comm_s", "overlap",
                                                              "allreduce_s", "bytes_sent", "bytes_recv",
                                                              "messages", "epoch_time_s")}, root=0)
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
                                rank_messages=[r["messages"] for r in per_rank], **accs)
                    metrics.write(line)
                    times.append(ep_time)
                    bytes_all.append(sent)
                    compute.append(max(r["compute_s"] for r in per_rank))
                    blocked.append(max(r["blocked_s"] for r in per_rank))
                    ov = [r["overlap"] for r in per_rank if r["overlap"] is not None]
                    if ov:
                        overlaps.append(min(ov))
                    if bar is not None:
                        post = dict(loss=f"{rec['loss']:.4f}")
                        if accs:
                            post.update(val=f"{accs['val_acc']:.3f}", best=f"{best['val_acc']:.3f}")
                        bar.set_postfix(post, refresh=False)
                        bar.update(1)
                if cfg.patience and since_best >= cfg.patience:
                    log.info("early stop at epoch %d: no better validation accuracy in %d evaluations",
                             epoch, cfg.patience)
                    break
        finally:
            if bar is not None:
                bar.close()
            if metrics is not None:
                metrics.close()
        if best["state"] is not None:
            self.model.load_state_dict(best["state"])
        logits = self.logits().numpy()
        write_predictions(comm, run_dir / "predictions.h5", self.part.orig_ids, logits, self.part.num_nodes,
                          attrs=dict(model=cfg.model, best_epoch=best["epoch"], partition_id=self.part.partition_id))
        rss = comm.allreduce(peak_rss_bytes(), op=MPI.MAX)
        if rank != 0:
            return {}
        save_state_dict(run_dir / "model.pt", self.model.state_dict())
        med = (lambda a: statistics.median(a) if a else None)  # noqa: E731
        summary = dict(
            model=cfg.model, world_size=comm.size, num_parts=self.meta["num_parts"],
            partition_method=self.meta.get("method"), num_nodes=self.part.num_nodes, num_edges=self.part.num_edges,
            epochs=epoch, best_epoch=best["epoch"], train_acc=best["accs"].get("train_acc"),
            val_acc=best["accs"].get("val_acc"), test_acc=best["accs"].get("test_acc"),
            final_loss=rec["loss"] if epoch else None, epoch_time_median_s=med(times),
            compute_time_median_s=med(compute), blocked_time_median_s=med(blocked),
            overlap_median=med(overlaps), bytes_sent_per_epoch=med(bytes_all), peak_rss_bytes_max=rss,
            schedule=cfg.schedule, sim_net=cfg.sim_net or None, valid=cfg.schedule != "nocomm",
            split_sizes=self.split_sizes)
        if cfg.schedule == "nocomm":
            summary["invalid_reason"] = "schedule nocomm skips the halo exchange: timings only, results are wrong"
        write_json_atomic(run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        self.ctx.free()


def prepare_run_dir(comm, cfg: TrainConfig) -> tuple[Path | None, str | None]:
    """Rank 0 creates the run directory (refusing a non-empty one without ``force``) and writes config.toml.
    Returns (path, error) identically on every rank."""
    err = None
    out = Path(cfg.out)
    if comm.rank == 0:
        try:
            if not cfg.out:
                raise ValueError("no run directory given (--out)")
            if out.exists() and not out.is_dir():
                raise ValueError(f"{out}: exists and is not a directory")
            if out.is_dir() and any(out.iterdir()):
                if not cfg.force:
                    raise ValueError(f"{out}: run directory exists and is not empty (use --force to replace it)")
                for name in ("metrics.jsonl", "summary.json", "model.pt", "predictions.h5", "config.toml"):
                    (out / name).unlink(missing_ok=True)
            if not out.parent.exists():
                raise ValueError(f"{out}: parent directory {out.parent} does not exist")
            out.mkdir(exist_ok=True)
            write_text_atomic(out / "config.toml", to_toml(cfg))
        except (OSError, ValueError) as e:
            err = str(e)
    err = comm.bcast(err, root=0)
    return (None if err else out), err
