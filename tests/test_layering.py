"""The layers' import rules (ARCHITECTURE, docs/RELIABILITY.md "The MPI base"):

- the data tools sit below the runtime: they read and write the on-disk format, use the shared torch-free MPI base
  ``g3mpi.mpi`` and a few small utilities, but never import the trainer, the model stack, the halo exchange
  (``g3mpi.comm``), the bench or the command lines;
- the data tools' command lines live in one module, ``data_tools/cli.py``: no library module of theirs imports
  argparse;
- the MPI base imports nothing of g3mpi but itself, and no torch: both sides of the pipeline stand on it;
- the data tools make no MPI call of their own but ``Abort``: every collective and point-to-point message goes
  through the base's wrappers, which carry the deadlines;
- a model is known by its name in one place, the model registry ``g3mpi/nn/specs.py``: nothing else compares a
  model with a name (``model == "gat"``, ``cfg.model in ("appnp", "gcn2")``); it asks the registry's entry."""
from __future__ import annotations

import ast
import re

from tests.conftest import REPO

DATA_TOOLS_MAY_IMPORT = ("g3mpi.format", "g3mpi.mpi", "g3mpi.log", "g3mpi.options", "g3mpi.plotting", "g3mpi.sorting",
                         "g3mpi.units")
#: a method call on a communicator spelled as MPI's (Allreduce, Isend, Barrier...): the base's business
RAW_MPI_CALL = re.compile(r"\bcomm\.(?!Abort\b)[A-Z][A-Za-z]*\(")


#: the model registry, the one file that may compare a model with its name
REGISTRY = REPO / "g3mpi" / "nn" / "specs.py"


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


#: the data tools' one command-line module, the only one that may import argparse
DATA_TOOLS_CLI = REPO / "data_tools" / "cli.py"


def imports_argparse(path) -> bool:
    """Whether the file imports argparse (``import argparse`` or ``from argparse import``), at any depth."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "argparse":
            return True
    return False


def test_only_the_data_tools_cli_module_imports_argparse():
    files = sorted((REPO / "data_tools").rglob("*.py"))
    assert DATA_TOOLS_CLI in files and imports_argparse(DATA_TOOLS_CLI)
    parsing = [str(p.relative_to(REPO)) for p in files if p != DATA_TOOLS_CLI and imports_argparse(p)]
    assert not parsing, "argparse outside data_tools/cli.py:\n" + "\n".join(parsing)


def test_the_argparse_rule_sees_an_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from argparse import ArgumentParser\n    return ArgumentParser\n")
    good = tmp_path / "good.py"
    good.write_text("import argparse_extra\n")
    assert imports_argparse(bad) and not imports_argparse(good)


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


def _is_model(node) -> bool:
    """A name or attribute that holds a model (``model``, ``cfg.model``, ``self.model_name``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "model" in name.lower()


def _is_names(node) -> bool:
    """A string, or a tuple / list / set of strings."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(_is_names(e) for e in node.elts)


def model_name_comparisons(path) -> list[tuple[int, str]]:
    """(line, source) of every comparison of a model with a name or names in the file."""
    text = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_model(a) for a in sides) and any(_is_names(b) for b in sides):
                found.append((node.lineno, ast.get_source_segment(text, node)))
    return found


def test_no_model_name_is_compared_outside_the_registry():
    files = [p for p in sorted((REPO / "g3mpi").rglob("*.py")) if p != REGISTRY]
    assert len(files) > 50
    bad = [f"{p.relative_to(REPO)}:{line}: {src}" for p in files for line, src in model_name_comparisons(p)]
    assert not bad, "a model compared with its name outside g3mpi/nn/specs.py (ask its entry):\n" + "\n".join(bad)


def test_the_registry_rule_sees_a_comparison(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f(cfg, model, kind):\n    if cfg.model in ("appnp", "gcn2"):\n        return 1\n'
                   '    if kind == "gcn":\n        return 2\n    return model != "gat"\n')
    assert [line for line, _ in model_name_comparisons(bad)] == [2, 6]


def test_the_pipeline_reads_of_a_layer_only_the_row_wise_protocol():
    """``g3mpi.ops.pipeline`` drives layers through ``g3mpi.sched.layers.RowwiseLayer`` alone: every attribute it
    reads of a layer (``layer.x``, ``layers[i].x``, ``c.x`` of ``for c in layers``) is one of the protocol's."""
    from g3mpi.sched.layers import RowwiseLayer
    members = set(RowwiseLayer.__annotations__) | {k for k in vars(RowwiseLayer) if not k.startswith("_")}
    tree = ast.parse((REPO / "g3mpi" / "ops" / "pipeline.py").read_text(encoding="utf-8"))

    def is_layer(v):
        return isinstance(v, ast.Name) and v.id in ("layer", "c") or \
            isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name) and v.value.id == "layers"
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and is_layer(n.value)}
    assert {"pre", "root", "post", "exchange", "scale_out", "from_input_product"} <= read
    assert read <= members, f"the pipeline reads {sorted(read - members)} of a layer outside RowwiseLayer"
