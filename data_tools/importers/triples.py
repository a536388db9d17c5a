"""``g3-prepare triples DIR``: a knowledge graph as it ships in triple files (docs/LINKS.md#import): ``train.txt``,
``valid.txt``, ``test.txt`` in DIR, one ``head<TAB>relation<TAB>tail`` a line (FB15k-237, WN18RR, ...; ``.gz``
accepted). Entity and relation names get IDs in order of first appearance in train.txt and are stored as
dictionaries; the training triples are the message-passing graph and the train split, valid.txt and test.txt the
held-out val and test splits. A name of valid.txt or test.txt that train.txt lacks is refused (its embedding could
not be trained), naming the file and line. ``add_inverse``: relation r gets an inverse r + R (``NAME_inverse``),
with an edge tail -> head for each training triple. Also :func:`generate_kg`, a seeded synthetic knowledge graph
written as such files, for tests and benchmarks."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.format import FormatError
from g3mpi.format.links import link_name

from .common import RawGraph
from .textio import open_text

SPLIT_FILES = (("train", "train.txt"), ("val", "valid.txt"), ("test", "test.txt"))
INVERSE_SUFFIX = "_inverse"


def find_file(directory: Path, name: str) -> Path:
    for cand in (directory / name, directory / (name + ".gz")):
        if cand.exists():
            return cand
    raise FormatError(directory / name, "no such file (a triples directory holds train.txt, valid.txt, test.txt)")


def read_triples(path: Path, entities: dict, relations: dict, grow: bool) -> np.ndarray:
    """int64 [M, 3] (head, relation, tail) of one triple file. ``entities`` / ``relations``: name -> ID, grown as
    new names appear with ``grow`` (train.txt); without it a name not in them is refused, naming the line."""
    out = []
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) != 3:
                raise FormatError(f"{path}:{lineno}", f"expected 3 tab-separated columns (head, relation, tail), "
                                                      f"got {len(cols)}")
            h, r, t = (c.strip() for c in cols)
            out.append((_id(entities, h, path, lineno, "entity", grow),
                        _id(relations, r, path, lineno, "relation", grow),
                        _id(entities, t, path, lineno, "entity", grow)))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def _id(table: dict, name: str, path, lineno: int, what: str, grow: bool) -> int:
    i = table.get(name)
    if i is None:
        if not grow:
            raise FormatError(f"{path}:{lineno}", f"unknown {what} {name!r} (not in train.txt: it would have no "
                                                  "trained embedding)")
        if not name:
            raise FormatError(f"{path}:{lineno}", f"empty {what} name")
        i = table[name] = len(table)
    return i


def load_triples(directory: Path, add_inverse: bool = False) -> RawGraph:
    directory = Path(directory)
    if not directory.is_dir():
        raise FormatError(directory, "no such directory (expected train.txt, valid.txt, test.txt in it)")
    ents: dict = {}
    rels: dict = {}
    splits = {}
    for split, name in SPLIT_FILES:
        path = find_file(directory, name)
        splits[split] = read_triples(path, ents, rels, grow=split == "train")
    n, R = len(ents), len(rels)
    train = splits["train"]
    src, dst, typ = train[:, 0], train[:, 2], train[:, 1]
    names = list(rels)
    inverse = None
    if add_inverse:
        src, dst, typ = np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([typ, typ + R])
        names += [x + INVERSE_SUFFIX for x in names]
        inverse = np.concatenate([np.arange(R, 2 * R), np.arange(R)])
    links = {}
    for split, t in splits.items():
        links[link_name(split, "edge")] = np.ascontiguousarray(t[:, [0, 2]])
        links[link_name(split, "edge_type")] = np.ascontiguousarray(t[:, 1])
    return RawGraph(path=str(directory), num_nodes=n, src=src, dst=dst, feature_dim=0,
                    features=np.zeros((n, 0), np.float32), masks={m: np.zeros(n, bool) for m in
                                                                  ("train_mask", "val_mask", "test_mask")},
                    source=f"triples:{directory.name}{',inverse' if add_inverse else ''}", edge_type=typ,
                    num_relations=len(names), relation_names=names, relation_inverse=inverse,
                    entity_names=list(ents), links=links)


def generate_kg(directory, entities: int = 10_000, relations: int = 20, triples: int = 200_000,
                valid: float = 0.05, test: float = 0.05, seed: int = 0) -> dict:
    """Write a seeded synthetic knowledge graph as train.txt / valid.txt / test.txt into ``directory``.

    Each relation r maps entity clusters to clusters (entities in 16 clusters; r sends cluster c to (c * a_r + b_r)
    mod 16), with heads drawn Zipf-skewed, so a relational model can learn it; the triples are distinct, every
    entity and relation of valid/test appears in train (the rest is moved to train), and no held-out triple is a
    training triple. Names: ``e<ID>``, ``r<ID>``. Returns the counts written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    k = 16
    cluster = rng.integers(0, k, entities)
    members = [np.flatnonzero(cluster == c) for c in range(k)]
    a, b = rng.integers(1, k, relations) | 1, rng.integers(0, k, relations)
    want = int(triples)
    got = np.zeros((0, 3), np.int64)
    while len(got) < want:
        m = 2 * (want - len(got)) + 64
        h = np.minimum(rng.zipf(1.3, m) - 1, entities - 1)
        h = rng.permutation(entities)[h]
        r = rng.integers(0, relations, m)
        tc = (cluster[h] * a[r] + b[r]) % k
        t = np.array([members[c][rng.integers(0, len(members[c]))] if len(members[c]) else 0 for c in tc])
        new = np.stack([h, r, t], axis=1)
        got = np.unique(np.concatenate([got, new[h != t]]), axis=0)
    got = got[rng.permutation(len(got))[:want]]
    n_val, n_test = int(valid * want), int(test * want)
    held, train = got[:n_val + n_test], got[n_val + n_test:]
    seen_e = np.zeros(entities, bool)
    seen_e[train[:, 0]] = seen_e[train[:, 2]] = True
    seen_r = np.zeros(relations, bool)
    seen_r[train[:, 1]] = True
    ok = seen_e[held[:, 0]] & seen_e[held[:, 2]] & seen_r[held[:, 1]]
    train = np.concatenate([train, held[~ok]])
    held = held[ok]
    parts = dict(train=train, valid=held[:n_val], test=held[n_val:])
    for name, t in parts.items():
        lines = [f"e{x}\tr{y}\te{z}\n" for x, y, z in t.tolist()]
        (directory / f"{name}.txt").write_text("".join(lines))
    return {name: len(t) for name, t in parts.items()}


def main(argv=None) -> int:
    """``python -m data_tools.importers.triples``: its parser and main live in :mod:`data_tools.cli`."""
    from ..cli import triples_main
    return triples_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
