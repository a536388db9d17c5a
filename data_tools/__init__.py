"""g3mpi data tools: importers, generators, partitioners and inspection (never imports the trainer).

``write_graph(path, edge_index, x, y, masks)`` writes a graph held as arrays (NumPy, torch, a PyG ``Data``'s
fields) to a graph.h5 (docs/PREPARE.md, "From Python")."""


def write_graph(path, edge_index, x, y=None, masks=None, **options) -> dict:
    """:func:`data_tools.arrays.write_graph` (imported on first use: ``import data_tools`` stays light)."""
    from .arrays import write_graph as write
    return write(path, edge_index, x, y, masks, **options)
