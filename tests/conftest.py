"""Shared test helpers: how to start the project's command lines, serially or under mpiexec; and the markers of
pytest.ini: ``mpi`` / ``slurm`` for every test that reaches mpiexec or the local SLURM cluster, ``slow`` for the
tests a module names in ``SLOW_TESTS``."""
from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
#: Cora with the public Planetoid split, shipped in the repository (data/README.md)
CORA = REPO / "data" / "cora.npz"
#: data sets beside the repository (../shared/datasets), which tests that use them skip without
SHARED = REPO.parent / "shared"
# a test gets the marker when it, a fixture it uses or a test helper either calls reaches one of these functions
MARKED_CALLS = {
    "mpi": {("conftest.py", "run_mpi"), ("conftest.py", "mpiexec")},
    "slurm": {("slurm_cluster.py", "local_cluster")},
}


def skip_or_fail(reason: str) -> None:
    """Skip a test whose tools this machine lacks (no root to install SLURM or h5ls), saying why; under
    ``G3_NO_SKIP=1`` (what ``.ci/run`` sets, since it installs them) fail instead, so that CI never passes with a
    part of the suite silently not run."""
    if os.environ.get("G3_NO_SKIP") == "1":
        pytest.fail(f"{reason} (G3_NO_SKIP=1: no test may skip here)", pytrace=False)
    pytest.skip(reason)


def tool_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def mpiexec() -> str:
    """The mpiexec that belongs to this interpreter's MPI (the pip MPICH beside sys.executable)."""
    cand = Path(sys.executable).parent / "mpiexec"
    return str(cand) if cand.exists() else (shutil.which("mpiexec") or "mpiexec")


def run_module(module: str, *args, timeout: float = 300, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` (the same code as the console script) and capture its output."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=tool_env(), timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def run_mpi(n: int, module: str, *args, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n n python -m mpi4py -m module args`` (an exception on one rank aborts all)."""
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", module, *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=tool_env(), timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def cora_npz() -> Path:
    assert CORA.exists(), f"{CORA} is part of the repository"
    return CORA



@pytest.fixture(scope="module")
def cora_h5(tmp_path_factory, cora_npz):
    """Cora as a graph file (one per test module): (the Graph, its path)."""
    from tests.partition_graphs import cora_graph, write
    path = tmp_path_factory.mktemp("cora") / "cora.h5"
    g = cora_graph(cora_npz)
    write(g, path)
    return g, path


@pytest.fixture(scope="module")
def rand_h5(tmp_path_factory):
    """A random directed graph of 300 nodes as a graph file (one per test module): (the Graph, its path)."""
    from tests.partition_graphs import random_graph, write
    path = tmp_path_factory.mktemp("rand") / "rand.h5"
    g = random_graph(n=300, m=1500, seed=3)
    write(g, path)
    return g, path


def _test_code(obj):
    """The code object of a function defined under tests/ (unwrapping decorators such as contextmanager)."""
    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
    return code if code is not None and Path(code.co_filename).parent == TESTS else None


def _reached(fn, seen: set) -> set:
    """(file, function) of ``fn`` and of every tests/ function it reaches by name: its nested functions, the
    helpers it calls, the methods of the test classes it names."""
    fn = inspect.unwrap(fn)
    code = _test_code(fn)
    if code is None or code in seen:
        return set()
    seen.add(code)
    found, codes = set(), [code]
    while codes:
        c = codes.pop()
        found.add((Path(c.co_filename).name, c.co_name))
        codes += [k for k in c.co_consts if inspect.iscode(k)]
        for name in c.co_names:
            target = fn.__globals__.get(name)
            for member in vars(target).values() if inspect.isclass(target) else (target,):
                found |= _reached(member, seen)
    return found


def _slow_names(module) -> set:
    """The module's ``SLOW_TESTS``: test names, or ``name[id]`` for one case of a parametrized test."""
    names = set(getattr(module, "SLOW_TESTS", ()))
    unknown = sorted(n for n in names if not callable(getattr(module, n.split("[")[0], None)))
    if unknown:
        raise pytest.UsageError(f"{module.__file__}: SLOW_TESTS names {', '.join(unknown)}, not a test there")
    return names


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Give the markers before ``-m`` selects: ``mpi`` / ``slurm`` from what each test calls, ``slow`` from its
    module's ``SLOW_TESTS`` (or a module-wide ``pytestmark``)."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        funcs = [getattr(item, "function", None)]
        funcs += [defs[-1].func for defs in (fixtures.name2fixturedefs.values() if fixtures else ()) if defs]
        reached = set().union(*(_reached(f, set()) for f in funcs if f is not None))
        for marker, calls in MARKED_CALLS.items():
            if reached & calls:
                item.add_marker(marker)
        module = getattr(item, "module", None)
        if module is not None and {item.name, getattr(item, "originalname", item.name)} & _slow_names(module):
            item.add_marker("slow")
