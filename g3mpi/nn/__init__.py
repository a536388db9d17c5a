"""Distributed GNN layers (one per file), the model stack, the model registry, and the public API of user models.

User models (``from g3mpi import nn as gnn``; docs/MODELS.md): ``Graph`` (the rank's graph handle), ``Propagate``,
``Attention``, ``Dropout``, ``global_sum``/``global_mean``/``global_max``, ``DropoutKey``, and the layer contract
``Layer`` with ``run_stack`` (which every built-in stack uses too), ``relu_``; for link prediction
``Pairs`` (scores of global node pairs through the pair exchange), ``NodeIds``, ``DotDecoder``, ``HadamardDecoder``;
``NodeEmbedding`` (a learned row per node, held by its owner). Layers never call MPI: they use ``g3mpi.ops``. The built-in models are the registry's (``g3mpi.nn.specs``, which
imports no torch: so this package imports its members on first use).
"""
from __future__ import annotations

import importlib
import importlib.util

#: public name -> the module (of this package, or absolute) that defines it
_HOME = {"Graph": "g3mpi.ops", "DropoutKey": "g3mpi.ops", "relu_": "g3mpi.ops.activation",
         "global_max": "g3mpi.ops.reduce", "global_mean": "g3mpi.ops.reduce", "global_sum": "g3mpi.ops.reduce",
         "Layer": ".base", "run_stack": ".base", "GATLayer": ".gat", "GCNLayer": ".gcn", "SAGELayer": ".sage",
         "DECODERS": ".link", "DotDecoder": ".link", "HadamardDecoder": ".link", "DistMultDecoder": ".link", "NodeIds": ".link", "Pairs": ".link",
         "ACTIVATIONS": ".model", "GNN": ".model", "DistBatchNorm": ".norm", "Attention": ".primitives",
         "Dropout": ".primitives", "Propagate": ".primitives", "APPNP": ".appnp", "GCN2": ".gcn2",
         "RecipeGNN": ".recipe", "build_model": ".recipe", "MODELS": ".specs",
         "NodeEmbedding": ".embedding", "EmbeddingInput": ".embedding", "sharded_parameters": ".embedding",
         "replicated_state": ".embedding"}
_ALIAS = {"Graph": "DistGraph", "MODELS": "names"}

__all__ = ["Graph", "Propagate", "Attention", "Dropout", "DropoutKey", "global_sum", "global_mean", "global_max",
           "Layer", "run_stack", "relu_",
           "GATLayer", "GCNLayer", "SAGELayer", "GNN", "MODELS", "ACTIVATIONS", "APPNP", "GCN2", "RecipeGNN",
           "DistBatchNorm", "build_model", "Pairs", "NodeIds", "DotDecoder", "HadamardDecoder", "DistMultDecoder", "DECODERS",
           "NodeEmbedding", "EmbeddingInput", "sharded_parameters", "replicated_state"]


def __getattr__(name: str):
    if name not in _HOME:    # a submodule (``gnn.primitives``), as an eager package would have it
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(_HOME[name], __name__), _ALIAS.get(name, name))
    if name == "MODELS":
        value = value()
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
