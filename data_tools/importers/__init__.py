"""Importers and generators behind ``g3-prepare``: each returns a ``RawGraph`` that ``write_raw_graph`` turns
into a graph.h5 (see docs/PREPARE.md)."""
from .common import PrepareOptions, RawGraph, build_in_csr, normalize_rows, random_split, write_raw_graph
from .edgelist import load_edgelist
from .npz import load_npz
from .ogb import load_ogb
from .rmat import generate_rmat, rmat_edges
from .sbm import generate_sbm

__all__ = ["PrepareOptions", "RawGraph", "build_in_csr", "normalize_rows", "random_split", "write_raw_graph",
           "load_npz", "load_ogb", "load_edgelist", "generate_rmat", "rmat_edges", "generate_sbm"]
