"""Autograd operators of the distributed runtime: sparse aggregation, GAT attention, halo exchange, dropout."""
from .aggregate import Aggregation
from .blocks import SpMM
from .dropout import DropoutKey, edge_keep_mask, keep_mask, node_dropout
from .gat import GATAggregation
from .graph import DistGraph

__all__ = ["Aggregation", "DropoutKey", "edge_keep_mask", "keep_mask", "node_dropout", "GATAggregation",
           "DistGraph", "SpMM"]
