"""Distributed GNN layers (one per file), the model stack, and the public API of user models.

User models (``from g3mpi import nn as gnn``; docs/MODELS.md): ``Graph`` (the rank's graph handle), ``Propagate``,
``Attention``, ``Dropout``, ``global_sum``/``global_mean``/``global_max``, ``DropoutKey``, and the layer contract
``Layer`` with ``run_stack`` (which the built-in GCN, SAGE and GAT use too), ``relu_``; for link prediction
``Pairs`` (scores of global node pairs through the pair exchange), ``NodeIds``, ``DotDecoder``, ``HadamardDecoder``. Layers never call MPI:
they use ``g3mpi.ops``.
"""
from g3mpi.ops import DistGraph as Graph
from g3mpi.ops import DropoutKey
from g3mpi.ops.activation import relu_
from g3mpi.ops.reduce import global_max, global_mean, global_sum

from .base import Layer, run_stack
from .gat import GATLayer
from .gcn import GCNLayer
from .link import DECODERS, DotDecoder, HadamardDecoder, NodeIds, Pairs
from .model import ACTIVATIONS, GNN, MODELS
from .norm import DistBatchNorm
from .primitives import Attention, Dropout, Propagate
from .recipe import APPNP, GCN2, RecipeGNN, build_model
from .sage import SAGELayer

__all__ = ["Graph", "Propagate", "Attention", "Dropout", "DropoutKey", "global_sum", "global_mean", "global_max",
           "Layer", "run_stack", "relu_",
           "GATLayer", "GCNLayer", "SAGELayer", "GNN", "MODELS", "ACTIVATIONS", "APPNP", "GCN2", "RecipeGNN",
           "DistBatchNorm", "build_model", "Pairs", "NodeIds", "DotDecoder", "HadamardDecoder", "DECODERS"]
