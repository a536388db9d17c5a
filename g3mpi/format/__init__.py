"""The on-disk schema of g3mpi: graph files, partition directories, part files (see docs/FORMAT.md).

Pure h5py + numpy: shared by ``data_tools`` (which writes) and the runtime (which reads one part per rank).
"""
from .atomic import atomic_dir, atomic_file, check_output
from .checksums import array_sha256, file_sha256
from .errors import FormatError
from .jsonio import json_text, write_json
from .schema import FORMAT_VERSION, GRAPH_FORMAT, PARTITION_FORMAT, PARTITION_VERSION, PART_FORMAT, index_dtype
from .graph import (Graph, GraphWriter, check_csr, graph_fingerprint, graph_summary, load_graph, open_graph,
                    write_graph)
from .partition import (META_NAME, NODE_MAP_NAME, PartData, check_part, owner_of, part_name, read_meta,
                        read_node_map, read_part, read_part_edges, write_meta, write_node_map,
                        write_part)

__all__ = [
    "FORMAT_VERSION", "GRAPH_FORMAT", "PART_FORMAT", "PARTITION_FORMAT", "PARTITION_VERSION", "FormatError",
    "array_sha256", "atomic_dir", "atomic_file", "check_output", "file_sha256", "index_dtype", "json_text",
    "write_json", "Graph", "GraphWriter",
    "check_csr", "graph_fingerprint", "graph_summary", "load_graph", "open_graph", "write_graph", "META_NAME",
    "NODE_MAP_NAME", "PartData", "check_part", "owner_of", "part_name", "read_meta", "read_node_map", "read_part",
    "read_part_edges", "write_meta", "write_node_map", "write_part",
]
