"""The model registry: one entry (``ModelSpec``) per built-in model, the one place that knows a model by its name.
Imports no torch: the configuration, g3-train's options and --help, its start-up checks, the memory model and the
benchmarks read it before (or without) torch; ``build_model`` imports the entry's builder when a run builds one.

An entry holds how the model is built (``builder``: ``module:function`` of ``(graph, cfg, in_dim, out_dim) ->
nn.Module``; for the built-in stacks ``layer``, ``module:class`` of its ``g3mpi.nn.Layer``), what it can do
(attention heads, row-wise products, the input cache, recomputation in backward, recipe blocks), which of the
model settings (:data:`SETTINGS`) it reads, and its layer widths. Adding a built-in model is its layer file and
one entry in :data:`MODELS` (docs/MODELS.md, "Adding a built-in layer"). A user's model file registers nothing.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable

#: layers and propagation steps at most (a larger count is a typo: building 10^6 layers takes the better part of an
#: hour)
MAX_LAYERS = 1024
#: attention heads at most: a layer's weight is [hidden x heads, in]; beyond 2^63 torch's sizes overflow
MAX_HEADS = 2**16


@dataclass(frozen=True)
class Setting:
    """A model's own setting: a ``TrainConfig`` field and a g3-train option (``--name-with-dashes``). ``check``:
    its range, ``check(name, value)`` -> why the value is out of it (None: in it), which the configuration reports
    as its one error line."""
    name: str
    type: type
    default: object
    help: str
    check: Callable | None = None

    def problem(self, value) -> str | None:
        """Why ``value`` is out of the setting's range, or None."""
        return None if self.check is None else self.check(self.name, value)


def count(least: int, most: int) -> Callable:
    """A ``Setting.check``: an integer in ``least .. most``."""
    def check(name, v):
        if v < least:
            return f"{name} must be at least {least} (got {v})"
        return f"{name} must be at most {most} (got {v})" if v > most else None
    return check


def not_negative(most: int) -> Callable:
    """A ``Setting.check``: an integer in ``0 .. most``, 0 meaning none."""
    def check(name, v):
        if v < 0:
            return f"{name} must not be negative (got {v}; 0: none)"
        return f"{name} must be at most {most} (got {v})" if v > most else None
    return check


def fraction(upper_open: bool = False) -> Callable:
    """A ``Setting.check``: a number in [0, 1] (``upper_open``: [0, 1))."""
    def check(name, v):
        ok = 0.0 <= v < 1.0 if upper_open else 0.0 <= v <= 1.0
        return None if ok else f"{name} must be in [0, {'1)' if upper_open else '1]'} (got {v})"
    return check


def positive(name, v) -> str | None:
    """A ``Setting.check``: a finite positive number."""
    return None if math.isfinite(v) and v > 0 else f"{name} must be a finite positive number (got {v})"


#: every model setting, by name (one entry even where two models read it); fields of ``TrainConfig`` in this order
SETTINGS = {s.name: s for s in (
    Setting("heads", int, 8, "attention heads in hidden layers (concatenated)", count(1, MAX_HEADS)),
    Setting("out_heads", int, 1, "attention heads in the last layer (averaged)", count(1, MAX_HEADS)),
    Setting("attn_dropout", float, 0.0, "dropout on the attention coefficients", fraction(upper_open=True)),
    Setting("k", int, 10, "propagation steps", count(1, MAX_LAYERS)),
    Setting("alpha", float, 0.1, "teleport probability (appnp); initial residual strength (gcn2)", fraction()),
    Setting("theta", float, 0.5, "identity mapping strength, beta_l = log(theta / l + 1)", positive),
    Setting("num_bases", int, 0, "basis decomposition: each relation's weight a mix of this many bases (0: none)",
            not_negative(MAX_HEADS)),
    Setting("num_blocks", int, 0, "block-diagonal decomposition into this many blocks (0: none)",
            not_negative(MAX_HEADS)),
)}

#: the attention layers' settings, which the stacks (``GNN``, ``RecipeGNN``) take by name; a stack hands the others
#: of its entry to its layers' ``build`` as keywords
ATTENTION_SETTINGS = ("heads", "out_heads", "attn_dropout")


def stack_widths(spec: "ModelSpec", in_dim: int, hidden: int, out_dim: int, layers: int, heads: int = 8,
                 out_heads: int = 1) -> list[tuple[int, int, int]]:
    """(input width, output width, heads) of each layer of a built-in stack (``GNN``): ``hidden`` wide, the last
    ``out_dim``; attention layers ``heads`` heads of ``hidden`` channels concatenated, the last ``out_heads``."""
    out, d = [], in_dim
    for i in range(layers):
        last = i == layers - 1
        ch = out_dim if last else hidden
        h = (out_heads if last else heads) if spec.attention else 1
        out.append((d, ch * h if spec.attention and not last else ch, h))
        d = out[-1][1]
    return out


@dataclass(frozen=True)
class ModelSpec:
    """One built-in model (module docstring). ``title``: its name in messages."""
    name: str
    title: str
    builder: str                     # module:function (graph, cfg, in_dim, out_dim) -> nn.Module
    layer: str = ""                  # module:class of the stack's Layer (builder ``g3mpi.nn.recipe:build_stack``)
    settings: tuple = ()             # the names of SETTINGS it reads (heads, k, alpha, ...)
    #: its layers attend (heads and attention dropout apply; its attention computes without row chunks)
    attention: bool = False
    #: its products are chunked by rows and the inter-layer pipeline drives its steps
    rowwise: bool = True
    #: its first layer may keep its product of a constant input (``--input-cache``: aggregate-first layers)
    input_cache: bool = False
    #: the plain stack recomputes in backward what lies between two aggregations (``--remat cheap``)
    remat: bool = False
    #: the recipe blocks (docs/RECIPES.md) apply: the model is a stack of ``layer``
    recipe: bool = False
    #: it has a hidden activation even with one layer (else one layer has none)
    activation_with_one_layer: bool = False
    #: it needs the graph's edge types (a partition without them is refused at start-up)
    edge_types: bool = False
    #: the memory model (``g3mpi.train.memory``) of its aggregations: their kind ("gcn": weighted, with
    #: self loops; "mean": a row scaling, no self loops; "gat": attention; "typed": R-GCN's one typed block), and
    #: a root weight beside it (SAGE, R-GCN);
    #: "" where the memory model does not model it
    aggregation: str = ""
    root_weight: bool = False
    #: how the memory model lays out what lies around the aggregations: "stack" (``stack_widths``' layers),
    #: "appnp" (its MLP, then ``k`` steps of the output width, no parameter), "gcn2" (input linear, ``layers``
    #: layers of ``hidden`` channels with one [hidden, hidden] weight each, output linear)
    form: str = "stack"
    #: its PyG counterpart in ``torch_geometric.nn`` (``g3-bench vs-pyg``), "" for none
    pyg: str = ""
    #: layer widths: (input, output, heads) of each layer (``stack_widths``)
    widths: Callable = stack_widths

    def layer_widths(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2, heads: int = 8,
                     out_heads: int = 1) -> list[tuple[int, int, int]]:
        return self.widths(self, in_dim, hidden, out_dim, layers, heads, out_heads)

    def uses(self, setting: str) -> bool:
        return setting in self.settings

    def load_builder(self) -> Callable:
        return load(self.builder)

    def load_layer(self):
        return load(self.layer)


def load(path: str):
    """The object ``module:name`` names (imports the module)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _appnp_widths(spec, in_dim, hidden, out_dim, layers, heads=8, out_heads=1):
    """The MLP's widths, then the K steps' (out_dim each)."""
    return [(a, b, 1) for a, b in zip([in_dim] + [hidden] * (layers - 1), [hidden] * (layers - 1) + [out_dim])]


def _gcn2_widths(spec, in_dim, hidden, out_dim, layers, heads=8, out_heads=1):
    """The GCNII layers' widths (hidden each; the input and output linears outside them)."""
    return [(hidden, hidden, 1)] * layers


_STACK = "g3mpi.nn.recipe:build_stack"

#: every built-in model, by name (g3-train --model), in the order --help lists them
MODELS = {s.name: s for s in (
    ModelSpec("gcn", "GCN", _STACK, "g3mpi.nn.gcn:GCNLayer", input_cache=True, remat=True, recipe=True,
              aggregation="gcn", pyg="GCNConv"),
    ModelSpec("sage", "SAGE", _STACK, "g3mpi.nn.sage:SAGELayer", input_cache=True, remat=True, recipe=True,
              aggregation="mean", root_weight=True, pyg="SAGEConv"),
    ModelSpec("gat", "GAT", _STACK, "g3mpi.nn.gat:GATLayer", settings=("heads", "out_heads", "attn_dropout"),
              attention=True, rowwise=False, remat=True, recipe=True, aggregation="gat", pyg="GATConv"),
    ModelSpec("rgcn", "R-GCN", _STACK, "g3mpi.nn.rgcn:RGCNLayer", settings=("num_bases", "num_blocks"), remat=True,
              recipe=True, edge_types=True, aggregation="typed", root_weight=True),
    ModelSpec("appnp", "APPNP", "g3mpi.nn.appnp:build", settings=("k", "alpha"), aggregation="gcn", form="appnp",
              widths=_appnp_widths),
    ModelSpec("gcn2", "GCNII", "g3mpi.nn.gcn2:build", settings=("alpha", "theta"), activation_with_one_layer=True,
              aggregation="gcn", form="gcn2", widths=_gcn2_widths),
)}


def spec(name: str) -> ModelSpec:
    """The registry's entry of model ``name`` (a ValueError naming the known ones if there is none)."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"model {name!r}: expected one of {', '.join(MODELS)}") from None


def names() -> tuple:
    return tuple(MODELS)


def readers(setting: str) -> tuple:
    """The models that read ``setting``."""
    return tuple(m for m, s in MODELS.items() if setting in s.settings)


def input_cache_applies(cfg, in_dim: int, out_dim: int) -> bool:
    """Whether the model of the configuration ``cfg`` on ``in_dim`` features and ``out_dim`` outputs has a
    parameter-free product of its input to keep (``--input-cache``): a built-in whose entry keeps one
    (``input_cache``) as a plain stack (no recipe block, no node embedding), whose first layer aggregates before it
    multiplies: its input no wider than its output (what its ``Layer.input_product_free`` says once built)."""
    if cfg.model_file or cfg.node_embedding or not spec(cfg.model).input_cache or uses_recipe(cfg):
        return False
    w_in, w_out, _ = spec(cfg.model).layer_widths(in_dim, cfg.hidden, out_dim, cfg.layers, cfg.heads,
                                                  cfg.out_heads)[0]
    return w_in <= w_out


def uses_recipe(cfg) -> bool:
    """Whether the configuration asks for a recipe block (else a stack model is its plain ``GNN``)."""
    return bool(cfg.residual or cfg.norm != "none" or cfg.input_linear or cfg.output_linear or cfg.ffn
                or cfg.jk != "none")
