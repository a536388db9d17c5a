"""The Python API (g3mpi.train, g3mpi.evaluate): the documented example trains Cora on 2 ranks and prints its
summary; the API returns what the run directory says; a bad setting is one error, raised, on every rank."""
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, mpiexec, tool_env

SLOW_TESTS = ("test_example_trains_cora_on_two_ranks",)


def test_import_is_light():
    """`import g3mpi` and reaching g3mpi.train and g3mpi.evaluate import neither torch nor MPI."""
    code = ("import sys, g3mpi; assert callable(g3mpi.train) and callable(g3mpi.evaluate); "
            "print(sorted(m for m in ('torch', 'mpi4py.MPI') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=tool_env(), check=True)
    assert out.stdout.strip() == "[]"


def test_example_trains_cora_on_two_ranks(tmp_path):
    p = subprocess.run([mpiexec(), "-n", "2", sys.executable, str(REPO / "docs/examples/train_from_python.py"),
                        str(tmp_path)], capture_output=True, text=True, env=tool_env(), timeout=600)
    assert p.returncode == 0, p.stderr
    start = p.stdout.index('{\n "model"')
    printed = json.loads(p.stdout[start:p.stdout.index("}", start) + 1])
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert printed["world_size"] == 2 and printed["epochs"] == 200
    assert {k: on_disk[k] for k in printed} == printed
    assert printed["test_acc"] > 0.75
    assert f"test accuracy {on_disk['test_acc']:.4f}" in p.stdout   # evaluate's, of the saved model.pt
    assert "it/s" not in p.stderr and "\r" not in p.stderr   # no progress bar: stderr is not a terminal


def test_bad_setting_raises_with_did_you_mean(tmp_path, capfd):
    from mpi4py import MPI

    import g3mpi
    from g3mpi.api import RunFailed
    with pytest.raises(RunFailed) as e:
        g3mpi.train(parts=str(tmp_path), out=str(tmp_path / "run"), epoch=3, comm=MPI.COMM_SELF)
    assert e.value.code == 2
    err = capfd.readouterr().err
    assert "unknown setting 'epoch' (did you mean 'epochs'?)" in err and err.count("\n") == 1, err
