"""The data tools sit below the runtime: they read and write the on-disk format and share a few small utilities,
but never import the trainer, the model stack, communication, the bench or the command lines."""
from __future__ import annotations

import ast

from tests.conftest import REPO

DATA_TOOLS_MAY_IMPORT = ("g3mpi.format", "g3mpi.log", "g3mpi.mpi", "g3mpi.options", "g3mpi.plotting", "g3mpi.units")


def g3mpi_imports(path) -> list[tuple[int, str]]:
    """(line, module) of every ``import g3mpi...`` and ``from g3mpi... import`` in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "g3mpi"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "g3mpi":
            found += [(node.lineno, node.module)]
    return found


def allowed(module: str) -> bool:
    return any(module == ok or module.startswith(ok + ".") for ok in DATA_TOOLS_MAY_IMPORT)


def test_data_tools_import_only_the_format_and_small_utilities():
    files = sorted((REPO / "data_tools").rglob("*.py"))
    assert files
    upward = [f"{p.relative_to(REPO)}:{line}: {module}" for p in files for line, module in g3mpi_imports(p)
              if not allowed(module)]
    assert not upward, "data_tools imports above its layer:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import g3mpi.units\n\n\ndef f():\n    from g3mpi.cli.train import main\n    return main\n")
    assert [m for _, m in g3mpi_imports(bad) if not allowed(m)] == ["g3mpi.cli.train"]
