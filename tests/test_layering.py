"""The layers' import rules (ARCHITECTURE, docs/RELIABILITY.md "The MPI base"):

- the data tools sit below the runtime: they read and write the on-disk format, use the shared torch-free MPI base
  ``g3mpi.mpi`` and a few small utilities, but never import the trainer, the model stack, the halo exchange
  (``g3mpi.comm``), the bench or the command lines;
- the MPI base imports nothing of g3mpi but itself, and no torch: both sides of the pipeline stand on it;
- the data tools make no MPI call of their own but ``Abort``: every collective and point-to-point message goes
  through the base's wrappers, which carry the deadlines."""
from __future__ import annotations

import ast
import re

from tests.conftest import REPO

DATA_TOOLS_MAY_IMPORT = ("g3mpi.format", "g3mpi.mpi", "g3mpi.log", "g3mpi.options", "g3mpi.plotting", "g3mpi.sorting",
                         "g3mpi.units")
#: a method call on a communicator spelled as MPI's (Allreduce, Isend, Barrier...): the base's business
RAW_MPI_CALL = re.compile(r"\bcomm\.(?!Abort\b)[A-Z][A-Za-z]*\(")


def g3mpi_imports(path, root: str = "g3mpi") -> list[tuple[int, str]]:
    """(line, module) of every ``import ROOT...`` and ``from ROOT... import`` in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == root]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == root:
            found += [(node.lineno, node.module)]
    return found


def allowed(module: str, rules=DATA_TOOLS_MAY_IMPORT) -> bool:
    return any(module == ok or module.startswith(ok + ".") for ok in rules)


def test_data_tools_import_only_the_format_the_mpi_base_and_small_utilities():
    files = sorted((REPO / "data_tools").rglob("*.py"))
    assert files
    upward = [f"{p.relative_to(REPO)}:{line}: {module}" for p in files for line, module in g3mpi_imports(p)
              if not allowed(module)]
    assert not upward, "data_tools imports above its layer:\n" + "\n".join(upward)


def test_the_mpi_base_imports_neither_torch_nor_the_rest_of_g3mpi():
    files = sorted((REPO / "g3mpi" / "mpi").glob("*.py"))
    assert len(files) > 3
    bad = [f"{p.relative_to(REPO)}:{line}: {module}" for p in files
           for line, module in g3mpi_imports(p) + g3mpi_imports(p, "torch") if not allowed(module, ("g3mpi.mpi",))]
    assert not bad, "the MPI base imports above itself:\n" + "\n".join(bad)


def test_data_tools_make_no_mpi_call_of_their_own():
    files = sorted((REPO / "data_tools").rglob("*.py"))
    raw = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in files
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if RAW_MPI_CALL.search(line)]
    assert not raw, "MPI calls outside the base's wrappers (g3mpi.mpi.collectives):\n" + "\n".join(raw)


def test_the_checks_see_an_upward_import_and_a_raw_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import g3mpi.units\n\n\ndef f():\n    from g3mpi.cli.train import main\n    return main\n")
    assert [m for _, m in g3mpi_imports(bad) if not allowed(m)] == ["g3mpi.cli.train"]
    assert RAW_MPI_CALL.search("    comm.Allreduce(a, b)") and not RAW_MPI_CALL.search("comm.Abort(1)")
