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
from torch import nn

from g3mpi.format.links import link_name
from g3mpi.comm.pairs import DENSE_IDS, owner_of, route_rows
from g3mpi.format.links import SPLITS
from g3mpi.nn.link import DECODERS, RELATIONAL, NodeIds
from g3mpi.ops.negatives import negative_destinations
from g3mpi.ops.pairs import PairExchange

from .choices import HITS, SUFFIX
from .metrics import hits_at_k, mrr, ranking_metrics
from .ranking import filtered_ranks, triple_keys

EVAL_SPLITS = ("val", "test")
#: the epochs that key the evaluation negatives a split lacks (training epochs are 1, 2, ...)
EVAL_EPOCH = {"val": -1, "test": -2}


def link_misfit(meta: dict, metric: str, decoder: str = "dot") -> str | None:
    """Why the partition (``meta``: its meta.json) cannot train ``--task link`` with ``decoder`` judged by
    ``metric``, or None."""
    links = meta.get("links") or {}
    missing = [s for s in ("train",) + EVAL_SPLITS if not links.get(s, {}).get("edge")]
    if missing:
        return (f"task link needs link splits (train, val and test pairs), but the partition has "
                f"{'none' if len(missing) == 3 else 'no ' + ' or '.join(missing) + ' pairs'} (prepare the graph with "
                "g3-prepare --link-split TRAIN,VAL,TEST, or import a link dataset, then partition it again)")
    if decoder in RELATIONAL:
        if not meta.get("num_relations"):
            return (f"decoder {decoder} scores triples (head, relation, tail), but the partition has no edge types "
                    "(import a knowledge graph: g3-prepare triples, or use --decoder dot or hadamard)")
        shared = [s for s in EVAL_SPLITS if links[s].get("edge_neg")]
        if shared:
            return (f"decoder {decoder} ranks each triple against every entity, but the {shared[0]} split has "
                    "shared negative pairs (edge_neg) without relations")
        return None
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

    def keep_input_halo(self, *args, **kw):
        return self.encoder.keep_input_halo(*args, **kw)

    def forward(self, x, key=None):
        return self.encoder(x, key)


def build_decoder(cfg, num_relations: int = 0) -> nn.Module:
    if cfg.decoder in RELATIONAL:
        return DECODERS[cfg.decoder](cfg.embed_dim, num_relations=num_relations)
    return DECODERS[cfg.decoder](cfg.embed_dim, cfg.hidden, 2)


class LinkTask:
    """One rank's pairs of every split, their exchanges, the loss and the metrics (module docstring). Collective
    construction (plans the evaluation pairs and the fixed training pairs)."""

    def __init__(self, graph, part, cfg, watchdog):
        self.graph, self.cfg, self.wd = graph, cfg, watchdog
        self.links = links = part.links
        n = graph.num_nodes
        tr = links[link_name("train", "edge")]
        # training positives by source (stable, once): they and their sampled negatives (which keep the
        # source) are then runs of sorted sources, scored fused without a sort per epoch (``g3mpi.ops.pairs``)
        by_src = np.argsort(tr[:, 0], kind="stable")
        self.train_index = links[link_name("train", "edge_index")][by_src]
        self.train_src, self.train_dst = tr[by_src, 0], tr[by_src, 1]
        #: knowledge-graph completion (a relational decoder): pairs carry relations, heads are corrupted too,
        #: and val / test are ranked against every entity (filtered)
        self.kg = cfg.decoder in RELATIONAL
        self.R = int(part.num_relations)
        self.train_type = links[link_name("train", "edge_type")][by_src] if self.kg else None
        if self.kg:
            self._route_triples(part)
        fixed = None if self.kg else self._fixed_negatives("train")
        self._train_fixed = None
        if fixed is not None:
            src, dst = fixed[:2]
            self._train_fixed = self._plan("train", np.r_[self.train_src, src], np.r_[self.train_dst, dst],
                                           len(self.train_src))
        else:
            self._train_fixed = None
        k = 0 if fixed is not None else cfg.negatives * (2 if self.kg else 1)
        counts = np.array([len(tr) * (1 + k) if fixed is None else len(tr) + len(fixed[0])], dtype=np.int64)
        watchdog.allreduce(counts, what="the link loss's denominator")
        self.loss_terms = int(counts[0])
        # sampled negatives look up O(nodes) IDs an epoch where a rank has DENSE_IDS nodes per negative or fewer
        # on average: the map is kept whole on every rank then (O(pairs) bytes), no messages
        sampled = 0 if fixed is not None else int(counts[0]) * k // (1 + k)
        self.ids = NodeIds(graph, replicate=bool(sampled) and n * watchdog.comm.size <= DENSE_IDS * sampled)
        self._train = None      # (the epoch, its pairs) of sampled negatives
        # evaluation pairs, val then test: positives, then negatives; one exchange planned once
        self.eval = {}
        src, dst, rel = [], [], []
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
            if self.kg:
                t = links[link_name(s, "edge_type")]
                rel += [t, np.repeat(t, neg[3])]
            self.eval[s] = dict(pos=slice(start, start + len(e)),
                                neg=slice(start + len(e), start + len(e) + len(neg[0])), kind=neg[2], m=len(e),
                                k=neg[3])
            start += len(e) + len(neg[0])
        self.eval_pairs = PairExchange(graph, np.concatenate(src), np.concatenate(dst), name="eval-pairs",
                                       rel=np.concatenate(rel) if self.kg else None)
        self.split_sizes = {}
        sizes = np.array([len(tr)] + [self.eval[s]["m"] for s in EVAL_SPLITS], dtype=np.int64)
        watchdog.allreduce(sizes, what="link split sizes")
        self.split_sizes = dict(zip(("train",) + EVAL_SPLITS, map(int, sizes)))

    def _route_triples(self, part) -> None:
        """Every known triple (train, val, test) sent once to its tail's owner: ``self.at_tail`` int64 [k, 5]
        (split number, position, head, relation, tail) of the triples whose tail this rank owns; the head
        corruptions of training triples are scored there, and the tails' filters and head queries are made
        there."""
        rows = []
        for i, s in enumerate(SPLITS):
            e = self.links.get(link_name(s, "edge"))
            if e is None:
                continue
            rows.append(np.stack([np.full(len(e), i, np.int64), self.links[link_name(s, "edge_index")], e[:, 0],
                                  self.links[link_name(s, "edge_type")], e[:, 1]], axis=1))
        rows = np.concatenate(rows) if rows else np.zeros((0, 5), np.int64)
        g = self.graph
        _, owner = owner_of(self.wd, int(g.owned_start), int(g.owned_end), "link triples by tail")
        self.at_tail = route_rows(self.wd, rows, owner(rows[:, 4]), "link triples by tail")
        here = self.at_tail[self.at_tail[:, 0] == 0]
        self.head_index, self.head_tail, self.head_type = here[:, 1], here[:, 4], here[:, 3]

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

    def _plan(self, name: str, src, dst, num_pos: int, rel=None, reuse=None):
        pairs = PairExchange(self.graph, src, dst, name=f"{name}-pairs", rel=rel, reuse=reuse)
        return pairs, num_pos

    def train_pairs(self, epoch: int):
        """(the exchange of this epoch's training pairs, how many of them are positives, first)."""
        if self._train_fixed is not None:
            return self._train_fixed
        reuse = None
        if self._train is not None:
            if self._train[0] == epoch:
                return self._train[1]
            pat = self._train[1][0].first_pattern()
            reuse = None if pat is None else (pat, len(self.train_src))
            self._train[1][0].free()
        k, n = self.cfg.negatives, self.graph.num_nodes
        if self.kg:
            # triple e's draws 0..k-1 corrupt its tail (scored on the head's owner), k..2k-1 its head (scored on
            # the tail's owner as (tail, new head): the decoders are symmetric); keyed by e alone, as on one rank
            tails = negative_destinations(self.cfg.seed, epoch, self.train_index, 2 * k, n)[:, :k]
            heads = negative_destinations(self.cfg.seed, epoch, self.head_index, 2 * k, n)[:, k:]
            new = self.ids.to_new(np.r_[tails.reshape(-1), heads.reshape(-1)]).numpy()
            src = np.r_[self.train_src, np.repeat(self.train_src, k), np.repeat(self.head_tail, k)]
            dst = np.r_[self.train_dst, new]
            rel = np.r_[self.train_type, np.repeat(self.train_type, k), np.repeat(self.head_type, k)]
            self._train = (epoch, self._plan("train", src, dst, len(self.train_src), rel))
            return self._train[1]
        neg = negative_destinations(self.cfg.seed, epoch, self.train_index, k, n)
        dst = self.ids.to_new(neg.reshape(-1)).numpy()
        src = np.r_[self.train_src, np.repeat(self.train_src, k)]
        self._train = (epoch, self._plan("train", src, np.r_[self.train_dst, dst], len(self.train_src),
                                         reuse=reuse))
        return self._train[1]

    def loss_sum(self, h: torch.Tensor, decoder: nn.Module, epoch: int) -> torch.Tensor:
        """The BCE terms of this rank's training pairs, summed (divide by ``loss_terms``)."""
        pairs, m = self.train_pairs(epoch)
        return pairs.loss_sum(h, decoder, m)

    @torch.no_grad()
    def scores(self, h: torch.Tensor, decoder: nn.Module) -> np.ndarray:
        return self.eval_pairs(h, decoder).numpy()

    def evaluate(self, h: torch.Tensor, decoder: nn.Module, metric: str, scores: np.ndarray | None = None) -> dict:
        """``<split>_<metric>`` of val and test over all ranks (module docstring), the same on every rank, from
        the embeddings ``h`` (or the evaluation pairs' ``scores`` where given). Knowledge-graph completion
        ranks by every entity for mrr and hits@K and reports ``<split>_mrr``, ``_hits@1``, ``@3``, ``@10``."""
        if self.kg and metric not in ("roc_auc", "ap"):
            return self.filtered(h, decoder, metric)
        if scores is None:
            scores = self.scores(h, decoder)
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

    @torch.no_grad()
    def filtered(self, h: torch.Tensor, decoder: nn.Module, metric: str) -> dict:
        """Filtered MRR and Hits@K of the val and test triples against every entity, as tail and as head
        (:func:`.ranking.filtered_ranks`; known triples: every split's)."""
        g, n, R = self.graph, self.graph.num_nodes, self.R
        lo = int(g.owned_start)
        x = h.detach().double()
        ks = sorted({1, 3, 10} | ({int(metric.split("@")[1])} if metric in HITS else set()))
        # this rank's filters: tail queries skip the known (h, r, e) of its tails e, head queries the known
        # (e, r, t) of its heads e (every split's triples, on the head's owner: the part's own)
        at = self.at_tail
        tail_known = np.sort(triple_keys(at[:, 2], at[:, 3], at[:, 4], n, R))
        own = [(self.links[link_name(s, "edge")], self.links[link_name(s, "edge_type")]) for s in SPLITS
               if link_name(s, "edge") in self.links]
        e = np.concatenate([p for p, _ in own]) if own else np.zeros((0, 2), np.int64)
        t = np.concatenate([r for _, r in own]) if own else np.zeros(0, np.int64)
        head_known = np.sort(triple_keys(e[:, 1], t, e[:, 0], n, R))
        out = {}
        for i, sp in enumerate(SPLITS):
            if sp not in EVAL_SPLITS:
                continue
            p, r = self.links[link_name(sp, "edge")], self.links[link_name(sp, "edge_type")]
            mine = at[at[:, 0] == i]
            qt = decoder.query(x[torch.from_numpy(p[:, 0] - lo)], torch.from_numpy(r)).numpy()
            qh = decoder.query(x[torch.from_numpy(mine[:, 4] - lo)], torch.from_numpy(mine[:, 3])).numpy()
            got = filtered_ranks(self.wd, lo, x.numpy(), [
                (qt, p[:, 0] * R + r, p[:, 1], tail_known),
                (qh, mine[:, 4] * R + mine[:, 3], mine[:, 2], head_known)], n, R, ks,
                what=f"evaluation (filtered ranking, {sp})")
            out[f"{sp}_mrr"] = got["mrr"]
            out.update({f"{sp}_hits@{k}": got[f"hits@{k}"] for k in ks})
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
