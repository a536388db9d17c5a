"""Distributed GNN layers (one per file) and the model stack. Layers never call MPI: they use ``g3mpi.ops``."""
from .gat import GATLayer
from .gcn import GCNLayer
from .model import ACTIVATIONS, GNN, MODELS
from .norm import DistBatchNorm
from .recipe import APPNP, GCN2, RecipeGNN, build_model
from .sage import SAGELayer

__all__ = ["GATLayer", "GCNLayer", "SAGELayer", "GNN", "MODELS", "ACTIVATIONS", "APPNP", "GCN2", "RecipeGNN",
           "DistBatchNorm", "build_model"]
