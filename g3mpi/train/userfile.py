"""A user's model from ``--model-file PATH.py:FUNCTION``: the file is imported, ``FUNCTION(graph, in_dim, out_dim,
cfg)`` builds the module, and one evaluation pass checks its output. Every failure is a :class:`ModelFileError`
whose one line names the file, and the line of it that raised when there is one."""
from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

import torch
from torch import nn

#: the name the user's file is imported under (one per process: g3-train builds one model)
MODULE_NAME = "g3mpi_user_model"


class ModelFileError(Exception):
    """The model file, its function, the module built or its output is unusable (the message names the file)."""


def split_spec(spec: str) -> tuple[Path, str]:
    """``PATH.py:FUNCTION`` -> (path, function name)."""
    path, _, func = spec.rpartition(":")
    return Path(path), func


def _where(path: Path, e: BaseException) -> str:
    """``PATH:LINE`` of the deepest frame of ``e``'s traceback in the user's file (else of the deepest frame)."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve() == path.resolve()]
    f = (mine or frames or [None])[-1]
    return f"{path}:{f.lineno}" if f is not None and mine else f"{path}" + (
        f" (in {f.filename}:{f.lineno})" if f is not None else "")


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1]}" if text else type(e).__name__


def load_builder(spec: str):
    """The function ``FUNCTION`` of ``PATH.py`` (the file imported once per process)."""
    path, func = split_spec(spec)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such file"
        raise ModelFileError(f"{path}: {what} (--model-file takes PATH.py:FUNCTION)")
    mod = sys.modules.get(MODULE_NAME)
    if mod is None or Path(getattr(mod, "__file__", "")).resolve() != path.resolve():
        loader_spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ModelFileError(f"{path}: cannot be imported as Python (--model-file takes PATH.py:FUNCTION)")
        mod = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(mod)
        except SyntaxError as e:
            raise ModelFileError(f"{path}:{e.lineno}: importing the model file failed: SyntaxError: {e.msg}") \
                from None
        except Exception as e:  # noqa: BLE001 - whatever the user's file raises, one line naming it
            raise ModelFileError(f"{_where(path, e)}: importing the model file failed: {_reason(e)}") from None
        sys.modules[MODULE_NAME] = mod
    fn = getattr(mod, func, None)
    if not callable(fn):
        have = sorted(k for k, v in vars(mod).items() if callable(v) and getattr(v, "__module__", "") == MODULE_NAME)
        raise ModelFileError(f"{path}: no function {func!r} in it (it defines: {', '.join(have) or 'none'})")
    return fn


def build_user_model(spec: str, graph, in_dim: int, out_dim: int, cfg) -> nn.Module:
    """``FUNCTION(graph, in_dim, out_dim, cfg)`` of the model file ``spec``: the module it returns."""
    path, func = split_spec(spec)
    fn = load_builder(spec)
    try:
        model = fn(graph, in_dim, out_dim, cfg)
    except Exception as e:  # noqa: BLE001
        raise ModelFileError(f"{_where(path, e)}: {func}(graph, in_dim, out_dim, cfg) raised {_reason(e)}") \
            from None
    if not isinstance(model, nn.Module):
        raise ModelFileError(f"{path}: {func} returned {type(model).__name__}, not a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelFileError(f"{path}: {func} returned a module without parameters to train")
    return model


def check_output(spec: str, model: nn.Module, x: torch.Tensor, out_dim: int) -> None:
    """One evaluation pass of the user's ``model`` on the rank's input ``x``: its output must be a floating
    tensor [owned rows, out_dim]. Every rank calls it together (the pass exchanges halos)."""
    path, _ = split_spec(spec)
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as e:  # noqa: BLE001
        raise ModelFileError(f"{_where(path, e)}: the model's forward raised {_reason(e)}") from None
    want = (x.shape[0], out_dim)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or not out.is_floating_point():
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelFileError(f"{path}: the model's forward returned {got}, expected a float tensor [{want[0]}, "
                             f"{want[1]}] (this rank's {want[0]} owned nodes x {out_dim} outputs)")
