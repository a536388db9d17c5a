"""User models from ``g3-train --model-file PATH.py:FUNCTION`` (docs/MODELS.md): the examples of docs/examples/
train exactly (the user GCN as the built-in one; a seeded model with dropout the same for P = 1, 2, 4 and as the
single-process plain-PyTorch reference, docs/examples/single_process.py), resume,
and a bad model file is one line naming it on every rank and a non-zero exit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

from tests.conftest import run_mpi, tool_env
from tests.graphs import partition, random_graph
from tests.train_runs import error_lines

SLOW_TESTS = ("test_user_gcn_trains_as_the_builtin_gcn", "test_seeded_user_model_same_for_any_P",
              "test_resume_checks_the_model_file", "test_bad_model_file_stops_every_rank")
MOD = "g3mpi.cli.train"
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


@pytest.fixture(scope="module")
def small_parts(tmp_path_factory):
    from g3mpi.format import write_graph
    g = random_graph(n=160, f=8, c=4, seed=9)
    root = tmp_path_factory.mktemp("parts")
    write_graph(root / "graph.h5", g)
    for P in (1, 2, 4):
        partition(g, P, root / f"p{P}", seed=P)
    return root


def train(P, parts, out, *extra, check=True):
    where = ["--parts", parts, "--out", out] if out is not None else []
    return run_mpi(P, MOD, *where, "--no-progress", "--no-plots", "--log-level", "WARNING", *extra, check=check)


def params(run) -> dict:
    return torch.load(Path(run) / "model.pt", weights_only=True)


def assert_same_params(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.linalg.norm(a[k] - b[k]) <= tol * torch.linalg.norm(a[k]), k


def test_user_gcn_trains_as_the_builtin_gcn(small_parts, tmp_path):
    """docs/examples/user_gcn.py (Linear + Propagate "gcn") has the built-in GCN's parameters and maths: without
    dropout, the same seed trains the same model (which tests/test_models_exact.py holds equal to PyG's)."""
    args = ["--epochs", "5", "--dropout", "0", "--hidden", "8", "--seed", "3"]
    train(2, small_parts / "p2", tmp_path / "builtin", "--model", "gcn", *args)
    train(2, small_parts / "p2", tmp_path / "user", "--model-file", f"{EXAMPLES / 'user_gcn.py'}:build", *args)
    assert_same_params(params(tmp_path / "builtin"), params(tmp_path / "user"), 1e-5)


def test_seeded_user_model_same_for_any_P(small_parts, tmp_path):
    """docs/examples/resnet_gnn.py with dropout (keyed by global node ID): the same parameters, predictions and
    test accuracy for P = 1, 2, 4; the run directory names the model file."""
    spec = f"{EXAMPLES / 'resnet_gnn.py'}:build"
    args = ["--model-file", spec, "--epochs", "6", "--dropout", "0.3", "--hidden", "8", "--seed", "5"]
    for P in (1, 2, 4):
        train(P, small_parts / f"p{P}", tmp_path / f"r{P}", *args)
    ref = params(tmp_path / "r1")
    assert any(k.startswith("blocks.1.") for k in ref)
    sums = {P: json.loads((tmp_path / f"r{P}" / "summary.json").read_text()) for P in (1, 2, 4)}
    with h5py.File(tmp_path / "r1" / "predictions.h5") as f:
        lg1 = f["logits"][:]
    for P in (2, 4):
        assert_same_params(ref, params(tmp_path / f"r{P}"), 1e-5)
        with h5py.File(tmp_path / f"r{P}" / "predictions.h5") as f:
            np.testing.assert_allclose(f["logits"][:], lg1, rtol=1e-4, atol=1e-5)
        assert sums[P]["test_acc"] == sums[1]["test_acc"] and sums[P]["best_epoch"] == sums[1]["best_epoch"]
    assert sums[1]["model"] == spec
    assert f'model_file = "{spec}"' in (tmp_path / "r1" / "config.toml").read_text()
    # the single-process plain-PyTorch reference of docs/examples trains the same model
    p = subprocess.run([sys.executable, str(EXAMPLES / "single_process.py"), str(small_parts / "graph.h5"), spec,
                        "--epochs", "6", "--dropout", "0.3", "--hidden", "8", "--seed", "5"],
                       capture_output=True, text=True, env=tool_env(), timeout=300, check=True)
    one = json.loads(p.stdout.strip().splitlines()[-1])
    assert one["best_epoch"] == sums[1]["best_epoch"]
    assert abs(one["test_acc"] - sums[1]["test_acc"]) < 1e-6 and abs(one["val_acc"] - sums[1]["val_acc"]) < 1e-6


def test_resume_checks_the_model_file(small_parts, tmp_path):
    spec = f"{EXAMPLES / 'user_gcn.py'}:build"
    run = tmp_path / "run"
    train(2, small_parts / "p2", run, "--model-file", spec, "--epochs", "2", "--hidden", "8")
    (run / "summary.json").unlink()
    other = tmp_path / "other.py"
    other.write_text((EXAMPLES / "user_gcn.py").read_text())
    bad = train(2, None, None, "--resume", run, "--model-file", f"{other}:build", "--epochs", "3", check=False)
    assert bad.returncode != 0 and "model_file" in bad.stderr
    train(2, None, None, "--resume", run, "--epochs", "3")
    assert json.loads((run / "summary.json").read_text())["epochs"] == 3


BAD_FILES = {
    "raises": ("def build(graph, in_dim, out_dim, cfg):\n    x = 1\n    raise ValueError('no such layer')\n",
               "bad.py:3: build(graph, in_dim, out_dim, cfg) raised ValueError: no such layer"),
    "shape": ("import torch\nfrom torch import nn\n\nclass M(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.lin = nn.Linear(8, 3)\n\n"
              "    def forward(self, x, key=None):\n        return self.lin(x)\n\n"
              "def build(graph, in_dim, out_dim, cfg):\n    return M()\n",
              "the model's forward returned torch.float32 ["),
    "forward": ("import torch\nfrom torch import nn\n\ndef build(graph, in_dim, out_dim, cfg):\n"
                "    return M()\n\nclass M(nn.Linear):\n    def __init__(self):\n        super().__init__(3, 3)\n\n"
                "    def forward(self, x, key=None):\n        return x @ self.weight\n",
                "bad.py:12: the model's forward raised RuntimeError"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_model_file_stops_every_rank(case, small_parts, tmp_path):
    text, said = BAD_FILES[case]
    (tmp_path / "bad.py").write_text(text)
    p = train(2, small_parts / "p2", tmp_path / "run", "--model-file", f"{tmp_path / 'bad.py'}:build",
              "--epochs", "1", check=False)
    assert p.returncode != 0
    lines = error_lines(p.stderr)
    assert sorted(lines) == [0, 1], p.stderr
    for r in (0, 1):
        assert len(lines[r]) == 1 and said in lines[r][0], p.stderr
    assert not (tmp_path / "run").exists()


def test_load_errors_name_the_file(tmp_path):
    """In-process: a missing file, a missing function, a syntax error, a builder that returns no module."""
    from g3mpi.train.userfile import ModelFileError, build_user_model
    cfg = SimpleNamespace(hidden=4, layers=2, dropout=0.0)
    (tmp_path / "m.py").write_text("import torch\n\n\ndef helper():\n    pass\n\n\ndef build(graph, i, o, cfg):\n"
                                   "    return 3\n\n\ndef empty(graph, i, o, cfg):\n    return torch.nn.ReLU()\n")
    (tmp_path / "syn.py").write_text("def build(:\n")
    cases = [(f"{tmp_path / 'nope.py'}:build", "nope.py: no such file"),
             (f"{tmp_path / 'm.py'}:make", "m.py: no function 'make' in it (it defines: build, empty, helper)"),
             (f"{tmp_path / 'm.py'}:empty", "m.py: empty returned a module without parameters to train"),
             (f"{tmp_path / 'syn.py'}:build", "syn.py:1: importing the model file failed: SyntaxError"),
             (f"{tmp_path / 'm.py'}:build", "m.py: build returned int, not a torch.nn.Module")]
    for spec, said in cases:
        with pytest.raises(ModelFileError, match=None) as e:
            build_user_model(spec, None, 8, 3, cfg)
        assert said in str(e.value), str(e.value)


def test_model_file_setting_checked_and_model_idle():
    """--model-file takes PATH.py:FUNCTION; beside it --model has no effect (one warning), while the settings a
    model file may read (--hidden, --heads, ...) are not called idle."""
    from g3mpi.train.config import ConfigError, config_and_origins, ineffective_settings
    for bad in ("model.py", "model.py:", ":build", "model.py:2fast"):
        with pytest.raises(ConfigError, match="expected PATH.py:FUNCTION"):
            config_and_origins(None, dict(model_file=bad))
    cfg, given = config_and_origins(None, dict(model_file="m.py:build", model="sage", heads=4, attn_dropout=0.2))
    assert cfg.model_label == "m.py:build"
    assert ineffective_settings(cfg, given, world_size=2, input_cache_applies=False) == [
        "command line: --model sage has no effect: the model comes from model_file m.py:build"]


def test_param_buckets_of_any_module():
    """The gradient allreduce groups a module without ``convs`` by its children, last first, then its own
    parameters; a shared parameter goes once; frozen ones not at all."""
    from torch import nn

    from g3mpi.train.gradsync import param_buckets

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 3)
            self.b = nn.Linear(3, 3)
            self.c = nn.Sequential(self.a)          # shares a's parameters
            self.scale = nn.Parameter(torch.ones(1))
            self.frozen = nn.Parameter(torch.ones(1), requires_grad=False)
    m = M()
    buckets = param_buckets(m)
    ids = [[id(p) for p in b] for b in buckets]
    assert ids == [[id(m.a.weight), id(m.a.bias)], [id(m.b.weight), id(m.b.bias)], [id(m.scale)]]
