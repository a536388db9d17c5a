"""g3-train under real mpiexec for the tests of its failure behaviour (tests/test_train_faults.py, _resume.py,
_stops.py): a module's partitions of one random graph, the command, its per-rank error lines, a part rewritten
with valid checksums.

Every multi-rank run has a timeout, so a hang fails the test instead of hanging CI. Test-only fault hooks are
the ``G3_TEST_*`` variables of ``g3mpi.train.faults``.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from g3mpi.format import array_sha256, file_sha256, part_name, read_meta, write_meta
from tests.conftest import mpiexec, tool_env
from tests.graphs import partition, random_graph


MOD = "g3mpi.cli.train"
FAST = ["--no-progress", "--log-level", "WARNING", "--hidden", "8"]
#: --comm-timeout of the watchdog tests: well above every legitimate wait of one rank for another before the fault under
#: test. On 2 busy cores the ranks took 12-16 s to start and reached the first start-up check up to 2.0 s apart (torch's
#: import alone differs by that much), and building the Trainer differed by up to 1.7 s: 2 s fired there at times
COMM_TIMEOUT = 6


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    g = random_graph(n=200, f=8, c=4, seed=5)
    root = tmp_path_factory.mktemp("rel_parts")
    for P in (2, 3):
        partition(g, P, root / f"p{P}", seed=P)
    partition(g, 2, root / "p2other", seed=11)   # another partition of the same graph
    return root


def train(P, parts_dir, out, *extra, check=True, timeout=180, env=None):
    cmd = [mpiexec(), "-n", str(P), sys.executable, "-m", "mpi4py", "-m", MOD, *FAST, *map(str, extra)]
    if parts_dir is not None:
        cmd += ["--parts", str(parts_dir)]
    if out is not None:
        cmd += ["--out", str(out)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**tool_env(), **(env or {})}, timeout=timeout)
    p.elapsed = time.monotonic() - t0
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstderr:\n{p.stderr}")
    return p


def error_lines(stderr: str) -> dict:
    """rank -> the g3-train error lines that name that rank, each as ``g3-train: error: [rank r] message`` (the
    job's one line for several ranks, ``[ranks 0-2,5] message``, counts for each of them)."""
    out = {}
    for line in stderr.splitlines():
        m = re.match(r"g3-train: error: \[ranks? ([0-9,-]+)\] ", line)
        if m:
            for r in ranks_of(m.group(1)):
                out.setdefault(r, []).append(f"g3-train: error: [rank {r}] {line[m.end():]}")
    return out


def ranks_of(text: str) -> list[int]:
    """The ranks of a report's rank list (``"0-2,5"``: [0, 1, 2, 5])."""
    out = []
    for piece in text.split(","):
        lo, _, hi = piece.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def rewrite_part(d: Path, p: int, **datasets) -> None:
    """Replace datasets of part p in place, with correct dataset and meta.json checksums (a file that passes
    every checksum but carries bad content)."""
    path = d / part_name(p)
    with h5py.File(path, "r+") as f:
        for k, v in datasets.items():
            v = np.asarray(v)
            if f[k].shape == v.shape and f[k].dtype == v.dtype:
                f[k][...] = v
            else:
                del f[k]
                f.create_dataset(k, data=v)
            f[k].attrs["sha256"] = array_sha256(v)
    meta = read_meta(d)
    meta["files"][path.name] = file_sha256(path)
    write_meta(d, meta)


def read_ds(d: Path, p: int, k: str) -> np.ndarray:
    with h5py.File(d / part_name(p), "r") as f:
        return f[k][()]


def metrics(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
