"""cks: sha256 (first 16 hex) of a partition directory's node -> part assignment, and its max comm rows."""
import hashlib, sys
import numpy as np
from g3mpi.format import read_meta
from g3mpi.format.partition import read_node_map
d = sys.argv[1]
m = read_meta(d)
new_to_orig = np.asarray(read_node_map(d, m), dtype=np.int64)
a = np.empty(m["num_nodes"], dtype=np.int64)
off = m["offsets"]
for p in range(m["num_parts"]):
    a[new_to_orig[off[p]:off[p + 1]]] = p
print(hashlib.sha256(a.tobytes()).hexdigest()[:16], m["method"], m["quality"]["max_comm_rows"])
