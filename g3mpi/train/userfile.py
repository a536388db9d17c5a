"""A user's model from ``--model-file PATH.py:FUNCTION``: the file is imported, ``FUNCTION(graph, in_dim, out_dim,
cfg)`` builds the module, and one evaluation pass checks its output. Every failure is a :class:`ModelFileError`
whose one line names the file, and the line of it that raised when there is one."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import traceback
from pathlib import Path

import torch
from torch import nn

#: the name the user's file is imported under (one per process: g3-train builds one model)
MODULE_NAME = "g3mpi_user_model"


class ModelFileError(Exception):
    """The model file, its function, the module built or its output is unusable (the message names the file)."""


class UserExit(BaseException):
    """``os._exit(code)`` called by code outside g3mpi on the main thread (the model file's) while
    :func:`exits_guarded` is active: raised instead, so that the rank's leaving is reported and fails the job. A
    rank that skips its exit handlers this way otherwise looks to MPICH's launcher like one that crashed: it
    kills the other ranks and the job exits 0, as if it had finished."""

    def __init__(self, code, via: str = "os._exit"):
        super().__init__(code)
        self.code, self.via = code, via


#: the package whose own os._exit calls (an orphaned rank, a failed write) are left alone
_G3MPI = str(Path(__file__).resolve().parents[1])


#: the C library's process exits, which ctypes reaches past Python (``ctypes.CDLL(None)._exit(0)``)
C_EXITS = ("_exit", "_Exit", "exit", "quick_exit")


def _guarded_here(pid: int) -> bool:
    """The caller of the caller is the model's code on this process's main thread (not g3mpi's, not a fork's)."""
    caller = sys._getframe(2).f_code.co_filename
    return (os.getpid() == pid and threading.current_thread() is threading.main_thread()
            and not str(Path(caller).resolve()).startswith(_G3MPI))


class _GuardedCExit:
    """A C library exit function looked up through ctypes while :func:`exits_guarded` is active: a call from the
    model's code raises :class:`UserExit`; anything else (its ``argtypes``, a call after the block) is the real
    function's (ctypes caches the lookup on the library object, past the block)."""

    def __init__(self, func, name: str, pid: int, active):
        self.__dict__.update(_func=func, _name=name, _pid=pid, _active=active)

    def __call__(self, *args):
        if self._active() and _guarded_here(self._pid):
            code = getattr(args[0], "value", args[0]) if args else None
            raise UserExit(code, via=f"the C library's {self._name}")
        return self._func(*args)

    def __getattr__(self, name):
        return getattr(self._func, name)

    def __setattr__(self, name, value):
        setattr(self._func, name, value)


@contextlib.contextmanager
def exits_guarded():
    """Within the block, ``os._exit`` and the C library's exits looked up through ctypes (:data:`C_EXITS`), from
    this process's main thread and outside g3mpi, raise :class:`UserExit` (a forked child's, another thread's
    and g3mpi's own exit as always). A C extension's own call of ``_exit`` is out of reach (docs/RELIABILITY.md)."""
    import ctypes
    real, pid, lookup = os._exit, os.getpid(), ctypes.CDLL.__getitem__
    on = [True]

    def guarded(code):
        if _guarded_here(pid):
            raise UserExit(code)
        real(code)

    def getitem(lib, name):
        func = lookup(lib, name)
        return _GuardedCExit(func, name, pid, lambda: on[0]) if name in C_EXITS else func
    os._exit, ctypes.CDLL.__getitem__ = guarded, getitem
    try:
        yield
    finally:
        on[0] = False
        os._exit, ctypes.CDLL.__getitem__ = real, lookup


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
    if isinstance(e, UserExit):
        return f"{e.via}({e.code!r}) (a rank may not leave before the others)"
    if isinstance(e, SystemExit):
        return f"SystemExit: sys.exit({'' if e.code is None else repr(e.code)}) (a rank may not leave before the others)"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1]}" if text else type(e).__name__


def reason(e: BaseException) -> str:
    """``e`` in a few words: ``ValueError: its last line``, ``os._exit(0)``, ``SystemExit: sys.exit(3)``."""
    return _reason(e)


def user_frame(spec: str, e: BaseException) -> str | None:
    """``PATH:LINE`` of the deepest frame of ``e``'s traceback in the model file ``spec``, None if none is."""
    path, _ = split_spec(spec)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    return f"{path}:{frames[-1].lineno}" if frames else None


def code_frame(e: BaseException) -> str:
    """``FILE:LINE`` of the deepest frame of ``e``'s traceback ("" without one)."""
    frames = traceback.extract_tb(e.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


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
        except BaseException as e:  # noqa: BLE001 - whatever the user's file raises, one line naming it
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
    except BaseException as e:  # noqa: BLE001 - sys.exit and KeyboardInterrupt included
        verb = "called" if isinstance(e, (SystemExit, UserExit)) else "raised"
        raise ModelFileError(f"{_where(path, e)}: {func}(graph, in_dim, out_dim, cfg) {verb} {_reason(e)}") \
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
    except BaseException as e:  # noqa: BLE001 - sys.exit and KeyboardInterrupt included
        raise ModelFileError(f"{_where(path, e)}: the model's forward raised {_reason(e)}") from None
    want = (x.shape[0], out_dim)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or not out.is_floating_point():
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelFileError(f"{path}: the model's forward returned {got}, expected a float tensor [{want[0]}, "
                             f"{want[1]}] (this rank's {want[0]} owned nodes x {out_dim} outputs)")
