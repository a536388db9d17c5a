"""Strict JSON (non-finite floats as null), the text of every JSON file and line g3mpi and its tools write."""
from __future__ import annotations

import json
import os

import numpy as np

from .atomic import atomic_file


def json_safe(obj):
    """``obj`` with every non-finite float (an accuracy over an empty split is NaN) as None: strict JSON, which
    ``json.dumps`` would otherwise write as ``NaN``/``Infinity`` (or refuse, with ``allow_nan=False``)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(obj, indent: int | None = 1, sort_keys: bool = True) -> str:
    """``obj`` as strict JSON (:func:`json_safe`), without a final newline: every JSON file and line g3mpi and
    its tools write."""
    return json.dumps(json_safe(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


def write_json(path: os.PathLike | str, obj, sort_keys: bool = True) -> None:
    """``path`` := :func:`json_text` of ``obj`` and a newline, UTF-8, by :func:`atomic_file` (an interrupted
    write leaves the old file or none, never half of one)."""
    with atomic_file(path, force=True) as tmp:
        tmp.write_text(json_text(obj, sort_keys=sort_keys) + "\n", encoding="utf-8")

