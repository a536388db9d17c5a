"""The stored dtype of node features: float32, float16 or bfloat16 (docs/FORMAT.md, "Feature dtype").

graph.h5 and the part files keep features in the dtype ``g3-prepare --feature-dtype`` chose (default: the
input's), recorded in the attribute ``feature_dtype``; the partitioners copy rows without converting them, and
training widens them to float32. NumPy has no bfloat16: it is stored as its raw 16-bit pattern (uint16), the
upper half of the float32 of the same value. Widening is exact for both half types (every float16 and bfloat16
value is a float32); narrowing rounds to nearest, ties to even (as ``torch.Tensor.to`` does).
"""
from __future__ import annotations

import numpy as np

from .errors import FormatError

FEATURE_DTYPES = ("float32", "float16", "bfloat16")
#: name -> the NumPy dtype that holds it in memory and in HDF5
STORED = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16)}
#: largest finite value of each
LIMITS = {"float32": float(np.finfo(np.float32).max), "float16": 65504.0, "bfloat16": 3.3895313892515355e38}


def stored_dtype(name: str) -> np.dtype:
    return STORED[name]


def natural_dtype(dtype) -> str:
    """The feature dtype an input array of ``dtype`` is kept in by default: float16 as given, else float32 (NumPy
    has no bfloat16: a bfloat16 input arrives as torch, widened, and is kept with ``--feature-dtype bfloat16``)."""
    return "float16" if np.dtype(dtype) == np.float16 else "float32"


def narrow(block: np.ndarray, name: str) -> np.ndarray:
    """``block`` (any real dtype) in the stored representation of ``name``: float32 or float16 by NumPy's
    conversion (round to nearest even), bfloat16 as the upper 16 bits of the float32, rounded to nearest even.
    Values beyond the type's range become infinite: :func:`check_narrowed` refuses them."""
    if name == "float32":
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(block, dtype=np.float32)
    if name == "float16":
        if block.dtype == np.float16:
            return np.ascontiguousarray(block)
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(np.asarray(block, dtype=np.float32).astype(np.float16))
    with np.errstate(over="ignore"):
        bits = np.ascontiguousarray(block, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def widen(block: np.ndarray, name: str) -> np.ndarray:
    """The stored ``block`` of dtype ``name`` as float32 (exact)."""
    if name == "bfloat16":
        return (np.asarray(block, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.asarray(block, dtype=np.float32)


def check_narrowed(path, given: np.ndarray, stored: np.ndarray, name: str, start: int = 0,
                   rows: str = "node") -> None:
    """FormatError naming ``path``, the row (``start`` + its row, called ``rows``), column and value of the first
    finite value of ``given`` that narrowing to ``name`` made infinite (beyond float16's 65504, say)."""
    if name == "float32":
        return
    bad = ~np.isfinite(widen(stored, name))
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise FormatError(path, f"features of {rows} {start + r} are beyond {name}'s range (column {c}: "
                                f"{float(given[r, c]):g}; largest {LIMITS[name]:g}): keep them as float32 "
                                f"(--feature-dtype float32) or scale them")


def feature_dtype_attr(path, value) -> str:
    """The ``feature_dtype`` attribute of a graph or part file, checked: FormatError naming the file otherwise."""
    name = value.decode() if isinstance(value, bytes) else value
    if not isinstance(name, str) or name not in FEATURE_DTYPES:
        raise FormatError(path, f"attribute 'feature_dtype' is {value!r:.40}, expected one of "
                                f"{', '.join(FEATURE_DTYPES)}")
    return name
