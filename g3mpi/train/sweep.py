"""A sweep's grid: a TOML file of g3-train settings, where a list is a dimension and the combinations are their
cartesian product (``jobs/slurm/sweep.sbatch``, one array element per combination; ``g3-sweep``).

    model = ["gcn", "sage"]     # a list: one dimension of the grid
    seed = [0, 1, 2]
    lr = [0.01, 0.005]
    epochs = 100                # a single value: the same for every combination

Keys are the settings of ``--config`` files (:class:`~g3mpi.train.config.TrainConfig`; ``weight-decay`` or
``weight_decay``). Combination ``i`` (0 <= i < :attr:`Grid.size`) is the ``i``-th of the product in the file's
order, the last dimension varying fastest: above, 0 is (gcn, 0, 0.01), 1 is (gcn, 0, 0.005), 2 is (gcn, 1, 0.01).
Every combination is checked as a configuration when the grid is read, so a bad value fails before any job runs.
"""
from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from .config import ConfigError, TrainConfig, _coerce

#: settings a grid cannot give: each element's run directory is the sweep's, and a grid is not a resume
NOT_IN_GRID = ("out", "force", "init_from", "time_limit")


class GridError(ValueError):
    """A grid file that cannot be read or gives a bad setting (the message names the file)."""


@dataclass(frozen=True)
class Grid:
    path: str
    fixed: dict        # setting -> value, the same for every combination
    dims: dict         # setting -> list of values, in the file's order

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.dims.values())

    def combination(self, index: int) -> dict:
        """The settings of combination ``index`` (fixed ones included)."""
        if not 0 <= index < self.size:
            raise GridError(f"{self.path}: no combination {index}: the grid has {self.size} "
                            f"(indices 0 to {self.size - 1}; sbatch --array=0-{self.size - 1})")
        rest, picked = index, {}
        for key in reversed(self.dims):   # the last dimension varies fastest
            values = self.dims[key]
            rest, k = divmod(rest, len(values))
            picked[key] = values[k]
        return {**self.fixed, **{k: picked[k] for k in self.dims}}

    def name(self, index: int) -> str:
        """Combination ``index``'s run directory name: the index and the swept settings, e.g.
        ``3-model-gcn_lr-0.005`` (a value's characters outside ``A-Za-z0-9.+-`` become ``_``; a path gives its
        last component)."""
        combo = self.combination(index)
        words = [f"{k}-{_word(combo[k])}" for k in self.dims]
        return f"{index}-{'_'.join(words)}" if words else str(index)

    def arguments(self, index: int) -> list[str]:
        """g3-train's command-line arguments for combination ``index``."""
        out = []
        for key, value in self.combination(index).items():
            opt = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                out.append(opt if value else f"--no-{key.replace('_', '-')}")
            else:
                out += [opt, _shown(value)]
        return out


def _shown(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _word(value) -> str:
    text = Path(value).name if isinstance(value, str) and "/" in value else _shown(value)
    return re.sub(r"[^A-Za-z0-9.+-]", "_", text) or "_"


def read_grid(path) -> Grid:
    """The grid in the TOML file ``path``; :class:`GridError` naming the file for a file that cannot be read,
    is not TOML, gives an unknown or disallowed setting, an empty list, or a combination that is not a valid
    configuration."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise GridError(f"{p}: no such grid file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise GridError(f"{p}: cannot be read: {getattr(e, 'strerror', None) or e}") from None
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise GridError(f"{p}: not valid TOML: {e}") from None
    types = {f.name: f.type for f in fields(TrainConfig)}
    fixed, dims = {}, {}
    for raw, value in data.items():
        key = raw.replace("-", "_")
        if key not in types:
            raise GridError(f"{p}: unknown setting {raw!r} (the keys are g3-train's settings, e.g. model, lr, seed)")
        if key in NOT_IN_GRID:
            raise GridError(f"{p}: {raw} cannot be part of a grid (sweep.sbatch chooses each element's run)")
        if key in fixed or key in dims:
            raise GridError(f"{p}: {key} is given twice")
        values = value if isinstance(value, list) else [value]
        if not values:
            raise GridError(f"{p}: {raw} is an empty list: the grid would have no combination")
        try:
            values = [_coerce(key, types[key], v, str(p)) for v in values]
        except ConfigError as e:
            raise GridError(str(e)) from None
        if any(isinstance(v, str) and "\n" in v for v in values):
            raise GridError(f"{p}: {raw}: a value with a line break")
        if len(set(map(repr, values))) < len(values):
            raise GridError(f"{p}: {raw} lists a value twice")
        (dims if isinstance(value, list) else fixed)[key] = values if isinstance(value, list) else values[0]
    grid = Grid(str(p), fixed, dims)
    for i in range(grid.size):   # every combination a valid configuration (the cheap checks; no files read)
        try:
            TrainConfig(**grid.combination(i))
        except ConfigError as e:
            raise GridError(f"{p}: combination {i} ({grid.name(i)}): {e}") from None
    return grid
