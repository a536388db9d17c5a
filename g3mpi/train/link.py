"""``--task link``: the model embeds nodes, a decoder scores node pairs, BCE over positives and negatives.

Pairs come from the partition's link splits (docs/LINKS.md): each rank holds the pairs whose source it owns, by new
global IDs, and each pair's position in its split. Training pairs: the split's positives, and its fixed negatives
where it has them (``link_train_edge_neg`` or ``link_train_target_node_neg``, planned once per run), else
``cfg.negatives`` negatives per positive drawn every epoch keyed by (seed, epoch, position)
(``g3mpi.ops.negatives``; planned once per epoch), so a seed trains the same model for every P. The loss is the sum
of the BCE terms of this rank's pairs divided by their number over all ranks: the single-process mean.

Evaluation pairs (val, test; planned once per run): the positives, and the split's shared negatives
(``edge_neg``), else its negatives per positive (``target_node_neg``), else one negative per positive keyed by
(seed, a fixed evaluation key, position). Metrics over all ranks (:mod:`.metrics`): ``roc_auc``, ``ap`` (positives
against every negative of the split), ``hits@K`` (OGB: against the split's negatives as one shared set), ``mrr``
(OGB: each positive against its own negatives; not for a split that has only shared ones).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi.format.links import link_name
from g3mpi.nn.link import DECODERS, NodeIds
from g3mpi.ops.negatives import negative_destinations
from g3mpi.ops.pairs import PairExchange

from .choices import HITS, SUFFIX
from .metrics import hits_at_k, mrr, ranking_metrics

EVAL_SPLITS = ("val", "test")
#: the epochs that key the evaluation negatives a split lacks (training epochs are 1, 2, ...)
EVAL_EPOCH = {"val": -1, "test": -2}


def link_misfit(meta: dict, metric: str) -> str | None:
    """Why the partition (``meta``: its meta.json) cannot train ``--task link`` judged by ``metric``, or None."""
    links = meta.get("links") or {}
    missing = [s for s in ("train",) + EVAL_SPLITS if not links.get(s, {}).get("edge")]
    if missing:
        return (f"task link needs link splits (train, val and test pairs), but the partition has "
                f"{'none' if len(missing) == 3 else 'no ' + ' or '.join(missing) + ' pairs'} (prepare the graph with "
                "g3-prepare --link-split TRAIN,VAL,TEST, or import a link dataset, then partition it again)")
    if metric == "mrr":
        shared = [s for s in EVAL_SPLITS if links[s].get("edge_neg") and not links[s].get("target_node_neg")]
        if shared:
            return (f"metric mrr ranks each positive against its own negatives, but the {shared[0]} split has only "
                    "shared ones (edge_neg): use --metric hits@K, roc_auc or ap")
    return None


class LinkModel(nn.Module):
    """The encoder (any model of the node tasks, output [n, embed_dim]) and the decoder of pairs; ``forward`` is
    the encoder's (state_dict keys ``encoder.*``, ``decoder.*``)."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        # the trainer's input halo (``GNN.keep_input_halo``) goes to a built-in encoder
        self.input_cache_applies = bool(getattr(encoder, "input_cache_applies", False))

    def keep_input_halo(self, *args, **kw):
        return self.encoder.keep_input_halo(*args, **kw)

    def forward(self, x, key=None):
        return self.encoder(x, key)


def build_decoder(cfg) -> nn.Module:
    return DECODERS[cfg.decoder](cfg.embed_dim, cfg.hidden, 2)


class LinkTask:
    """One rank's pairs of every split, their exchanges, the loss and the metrics (module docstring). Collective
    construction (plans the evaluation pairs and the fixed training pairs)."""

    def __init__(self, graph, part, cfg, watchdog):
        self.graph, self.cfg, self.wd = graph, cfg, watchdog
        self.links = links = part.links
        self.ids = NodeIds(graph)
        n = graph.num_nodes
        tr = links[link_name("train", "edge")]
        self.train_index = links[link_name("train", "edge_index")]
        self.train_src, self.train_dst = tr[:, 0], tr[:, 1]
        fixed = self._fixed_negatives("train")
        self._train_fixed = None
        if fixed is not None:
            src, dst = fixed[:2]
            self._train_fixed = self._plan("train", np.r_[self.train_src, src], np.r_[self.train_dst, dst],
                                           len(self.train_src))
        else:
            self._train_fixed = None
        k = 0 if fixed is not None else cfg.negatives
        counts = np.array([len(tr) * (1 + k) if fixed is None else len(tr) + len(fixed[0])], dtype=np.int64)
        watchdog.allreduce(counts, what="the link loss's denominator")
        self.loss_terms = int(counts[0])
        self._train = None      # (the epoch, its pairs) of sampled negatives
        # evaluation pairs, val then test: positives, then negatives; one exchange planned once
        self.eval = {}
        src, dst = [], []
        start = 0
        for s in EVAL_SPLITS:
            e = links[link_name(s, "edge")]
            neg = self._fixed_negatives(s)
            if neg is None:
                d = self.ids.to_new(negative_destinations(cfg.seed, EVAL_EPOCH[s], links[link_name(s, "edge_index")],
                                                          1, n)[:, 0]).numpy()
                neg = (e[:, 0], d, "per_positive", 1)
            src += [e[:, 0], neg[0]]
            dst += [e[:, 1], neg[1]]
            self.eval[s] = dict(pos=slice(start, start + len(e)),
                                neg=slice(start + len(e), start + len(e) + len(neg[0])), kind=neg[2], m=len(e),
                                k=neg[3])
            start += len(e) + len(neg[0])
        self.eval_pairs = PairExchange(graph, np.concatenate(src), np.concatenate(dst), name="eval-pairs")
        self.split_sizes = {}
        sizes = np.array([len(tr)] + [self.eval[s]["m"] for s in EVAL_SPLITS], dtype=np.int64)
        watchdog.allreduce(sizes, what="link split sizes")
        self.split_sizes = dict(zip(("train",) + EVAL_SPLITS, map(int, sizes)))

    def _fixed_negatives(self, s: str):
        """(src, dst, kind, k) of split ``s``'s stored negatives (new IDs): kind "shared" or "per_positive" (k of
        them per positive); None without any."""
        links = self.links
        shared = links.get(link_name(s, "edge_neg"))
        if shared is not None:
            return shared[:, 0], shared[:, 1], "shared", 0
        per = links.get(link_name(s, "target_node_neg"))
        if per is not None:
            e = links[link_name(s, "edge")]
            return np.repeat(e[:, 0], per.shape[1]), per.reshape(-1), "per_positive", per.shape[1]
        return None

    def _plan(self, name: str, src, dst, num_pos: int):
        pairs = PairExchange(self.graph, src, dst, name=f"{name}-pairs")
        return pairs, num_pos

    def train_pairs(self, epoch: int):
        """(the exchange of this epoch's training pairs, how many of them are positives, first)."""
        if self._train_fixed is not None:
            return self._train_fixed
        if self._train is not None:
            if self._train[0] == epoch:
                return self._train[1]
            self._train[1][0].free()
        k = self.cfg.negatives
        neg = negative_destinations(self.cfg.seed, epoch, self.train_index, k, self.graph.num_nodes)
        dst = self.ids.to_new(neg.reshape(-1)).numpy()
        src = np.r_[self.train_src, np.repeat(self.train_src, k)]
        self._train = (epoch, self._plan("train", src, np.r_[self.train_dst, dst], len(self.train_src)))
        return self._train[1]

    def loss_sum(self, h: torch.Tensor, decoder: nn.Module, epoch: int) -> torch.Tensor:
        """The BCE terms of this rank's training pairs, summed (divide by ``loss_terms``)."""
        pairs, m = self.train_pairs(epoch)
        z = pairs(h, decoder)
        y = torch.zeros(len(z), dtype=z.dtype)
        y[:m] = 1
        return F.binary_cross_entropy_with_logits(z, y, reduction="sum")

    @torch.no_grad()
    def scores(self, h: torch.Tensor, decoder: nn.Module) -> np.ndarray:
        return self.eval_pairs(h, decoder).numpy()

    def evaluate(self, scores: np.ndarray, metric: str) -> dict:
        """``<split>_<metric>`` of val and test over all ranks (module docstring), the same on every rank."""
        key = SUFFIX[metric]
        if metric in ("roc_auc", "ap"):
            s, y, g = [], [], []
            for i, sp in enumerate(EVAL_SPLITS):
                e = self.eval[sp]
                pos, neg = scores[e["pos"]], scores[e["neg"]]
                s += [pos, neg]
                y += [np.ones(len(pos), bool), np.zeros(len(neg), bool)]
                g += [np.full(len(pos) + len(neg), i)]
            auc, ap = ranking_metrics(self.wd, np.concatenate(s), np.concatenate(y), np.concatenate(g),
                                      len(EVAL_SPLITS), what="evaluation (link ranking)")
            val = auc if metric == "roc_auc" else ap
            return {f"{sp}_{key}": float(val[i]) for i, sp in enumerate(EVAL_SPLITS)}
        out = {}
        for sp in EVAL_SPLITS:
            e = self.eval[sp]
            pos, neg = scores[e["pos"]], scores[e["neg"]]
            if metric in HITS:
                out[f"{sp}_{key}"] = hits_at_k(self.wd, pos, neg, int(metric.split("@")[1]))
            else:   # mrr: negatives per positive (link_misfit refuses a split with shared ones only)
                out[f"{sp}_{key}"] = mrr(self.wd, pos, neg.reshape(len(pos), e["k"]))
        return out

    def prediction_rows(self, scores: np.ndarray, orig_ids: np.ndarray) -> dict:
        """predictions.h5's rows of this rank: per split, the positives' original IDs (``<split>_edge`` [M, 2])
        and scores (``<split>_score`` [M]) by position in the split; the negatives' (``<split>_edge_neg``,
        ``<split>_edge_neg_score`` by position among the shared ones, or ``<split>_neg_target`` and
        ``<split>_neg_score`` [M, K] per positive)."""
        dst_orig = self.eval_pairs.dst_values(np.asarray(orig_ids, np.int64))
        src_orig = np.asarray(orig_ids, np.int64)[self.eval_pairs.plan.src_rows]
        pairs = np.stack([src_orig, dst_orig], axis=1)
        links, rows = self.links, {}
        for sp in EVAL_SPLITS:
            e = self.eval[sp]
            M = self.split_sizes[sp]
            idx = links[link_name(sp, "edge_index")]
            rows[f"{sp}_edge"] = (idx, pairs[e["pos"]], M)
            rows[f"{sp}_score"] = (idx, scores[e["pos"]].astype(np.float32), M)
            if e["kind"] == "shared":
                nidx = links[link_name(sp, "edge_neg_index")]
                K = int(self.wd_sum(len(nidx)))
                rows[f"{sp}_edge_neg"] = (nidx, pairs[e["neg"]], K)
                rows[f"{sp}_edge_neg_score"] = (nidx, scores[e["neg"]].astype(np.float32), K)
            else:
                rows[f"{sp}_neg_score"] = (idx, scores[e["neg"]].astype(np.float32).reshape(e["m"], e["k"]), M)
                rows[f"{sp}_neg_target"] = (idx, pairs[e["neg"], 1].reshape(e["m"], e["k"]), M)
        return rows

    def wd_sum(self, v: int) -> int:
        a = np.array([v], dtype=np.int64)
        self.wd.allreduce(a, what="link prediction sizes")
        return int(a[0])

    def free(self) -> None:
        if self._train is not None:
            self._train[1][0].free()
        if self._train_fixed is not None:
            self._train_fixed[0].free()
        self.eval_pairs.free()
