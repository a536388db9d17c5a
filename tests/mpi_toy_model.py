"""g3-train with a toy built-in model registered (tests/test_specs.py): the second of the two edits of "adding a
built-in layer" (docs/MODELS.md), its registry entry, made here in the test only, before g3-train reads the
registry; then g3-train's own main.

mpiexec -n P python -m mpi4py -m tests.mpi_toy_model [g3-train options] --model toy [--eps E]
"""
from __future__ import annotations

import sys

from g3mpi.nn import specs

specs.SETTINGS["eps"] = specs.Setting("eps", float, 0.0, "weight of a node's own term beyond 1",
                                      lambda name, v: None if v > -1 else f"{name} must be above -1 (got {v})")
specs.MODELS["toy"] = specs.ModelSpec("toy", "Toy", "g3mpi.nn.recipe:build_stack", "tests.toy_layer:ToyLayer",
                                      settings=("eps",), remat=True, recipe=True)

if __name__ == "__main__":
    assert "g3mpi.train.config" not in sys.modules     # (the registry is read when the configuration is)
    from g3mpi.cli.train import main
    sys.exit(main())
