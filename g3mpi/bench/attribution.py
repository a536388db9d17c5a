"""The bytes a rank holds, attributed to what sizes them, as the memory model splits its terms
(:func:`g3mpi.train.memory.rank_memory_split`): the rank's owned rows, halo rows, send rows, local edges, or none of
them (``const``: parameters, gradients, Adam's moments).

Every array the rank holds is a :class:`Held` item of a term (part, matrices, exchange, activations, params) with
its ``rows``: the length that sizes it (the outer dimension of a tensor's storage, the entries of an index or value
array, the rows of a row pointer array). :func:`attribute` gives an item's bytes to the category whose count its
rows equal, among the :class:`Sizer` candidates of its term (:func:`sizers`):

    part         owned rows n, halo rows h, send rows s, owned + halo rows (split n : h), local edges e
    matrices     n, h, the entries of the aggregation's blocks (below), the cut edges c
    exchange     h, s
    activations  n and the row subsets a rank's tensors come in (the boundary and interior row groups of the
                 pipeline, the training rows of the loss), h, n + h, the blocks' entries, c, e
    params       ``const``, but a node embedding table's rows (n: owned)

A block's entries are edges, but for the self loops an aggregation adds (one per owned row): the local block's
e - c + d entries (d self loops) split e - c : d between ``edge`` and ``owned``, as the model counts them. Rows one
more than a count (a row pointer array) or a multiple H of it (GAT's head-expanded forms, H heads) match it too,
after exact matches. Where candidates of different categories have the same length, the first in the order above
wins and the bytes are counted in ``ambiguous`` as well; an item no candidate matches is ``other``.
"""
from __future__ import annotations

from dataclasses import dataclass

from g3mpi.train.memory import CATEGORIES

#: the terms of a rank's data, as in the worker's ``theoretical`` and the memory model
TERMS = ("part", "matrices", "exchange", "activations", "params")
#: the categories of a measured attribution: the model's and what matches none of its counts
MEASURED = CATEGORIES + ("other",)
#: items of ``other`` listed in the result (the largest)
OTHER_LISTED = 8


@dataclass(frozen=True)
class Held:
    """One array a rank holds: its term (:data:`TERMS`), what it is, the length that sizes it, its bytes."""

    term: str
    what: str
    rows: int
    nbytes: int


@dataclass(frozen=True)
class Sizer:
    """A count of the rank that can size an array: its name, its value, and how the bytes of an array of that many
    rows split between categories, ((category, rows), ...), in proportion to the rows."""

    name: str
    rows: int
    split: tuple


@dataclass(frozen=True)
class Block:
    """Entries of one aggregation matrix of the rank (``BlockMatrix.sizes``): its local block's, the self loops
    among them, each neighbour block's."""

    local: int
    self_loops: int
    neighbours: tuple = ()


@dataclass(frozen=True)
class RankCounts:
    """What can size a rank's arrays: n owned, h halo and s send rows (one per row of a send list), e local edges
    of which c cut (from halo rows), the boundary rows (those of the send lists, the pipeline's first row group),
    the training rows, its aggregation matrices' entries, and the head counts of head-expanded forms."""

    owned: int
    halo: int
    send: int
    edges: int
    cut_edges: int = 0
    boundary: int = 0
    train: int = 0
    blocks: tuple = ()      # of Block
    heads: tuple = ()       # H > 1 of the head-expanded forms built

    def as_dict(self) -> dict:
        return dict(owned=self.owned, halo=self.halo, send=self.send, edges=self.edges, cut_edges=self.cut_edges)


def sizers(c: RankCounts) -> dict:
    """{term: [Sizer, ...]}: the candidate counts of each term, in the order that decides between equal ones."""
    def one(name, rows, cat):
        return Sizer(name, int(rows), ((cat, int(rows)),))
    owned, halo, send = one("owned rows", c.owned, "owned"), one("halo rows", c.halo, "halo"), one("send rows", c.send,
                                                                                                 "send")
    both = Sizer("owned + halo rows", c.owned + c.halo, (("owned", c.owned), ("halo", c.halo)))
    edges, cut = one("local edges", c.edges, "edge"), one("cut edges", c.cut_edges, "edge")
    groups = [one("boundary rows", c.boundary, "owned"), one("interior rows", c.owned - c.boundary, "owned"),
              one("training rows", c.train, "owned")]
    entries = []
    for b in c.blocks:
        nb = sum(b.neighbours)
        entries += [Sizer("local block entries", b.local, (("edge", b.local - b.self_loops), ("owned", b.self_loops))),
                    Sizer("block entries", b.local + nb, (("edge", b.local + nb - b.self_loops),
                                                          ("owned", b.self_loops)))]
        entries += [one("neighbour block entries", x, "edge") for x in b.neighbours]
    out = dict(part=[owned, halo, send, both, edges], matrices=[owned, halo, *entries, cut], exchange=[halo, send],
               activations=[owned, *groups, halo, both, *entries, cut, edges], params=[owned])
    return {t: [z for z in v if z.rows > 0] for t, v in out.items()}


def _match(rows: int, cands: list, heads: tuple) -> list:
    """The candidates ``rows`` matches: exactly, else as a row pointer array (one more), else head-expanded."""
    for k in (1, *heads):
        for extra in (0, 1):
            got = [z for z in cands if rows == k * z.rows + extra]
            if got:
                return got
    return []


def _share(nbytes: int, split: tuple) -> dict:
    """``nbytes`` split between categories in proportion to their rows (whole bytes, the remainder to the last)."""
    total = sum(r for _, r in split)
    out, left = {}, nbytes
    for i, (cat, r) in enumerate(split):
        b = left if i == len(split) - 1 else nbytes * r // total
        out[cat] = out.get(cat, 0) + b
        left -= b
    return out


def attribute(items, counts: RankCounts) -> dict:
    """The bytes of ``items`` (:class:`Held`) by term and category: ``terms`` {term: {category: bytes}} over
    :data:`TERMS` and :data:`MEASURED`, ``categories`` their sums over the terms, ``total`` (= every item's bytes),
    ``ambiguous`` (bytes whose rows matched counts of different categories), ``other`` (the largest unmatched
    items: term, what, rows, bytes)."""
    cands = sizers(counts)
    terms = {t: dict.fromkeys(MEASURED, 0) for t in TERMS}
    ambiguous, other = 0, []
    for it in items:
        row = terms[it.term]
        if it.term == "params" and not it.rows:
            row["const"] += it.nbytes
            continue
        got = _match(it.rows, cands[it.term], tuple(h for h in counts.heads if h > 1))
        if not got:
            row["other"] += it.nbytes
            other.append(it)
            continue
        if len({tuple(c for c, _ in z.split) for z in got}) > 1:
            ambiguous += it.nbytes
        for cat, b in _share(it.nbytes, got[0].split).items():
            row[cat] += b
    cats = {c: sum(terms[t][c] for t in TERMS) for c in MEASURED}
    other.sort(key=lambda it: -it.nbytes)
    return dict(terms=terms, categories=cats, total=sum(cats.values()), ambiguous=ambiguous,
                other=[[it.term, it.what, it.rows, it.nbytes] for it in other[:OTHER_LISTED]])
