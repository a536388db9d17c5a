"""One report per job (g3mpi.mpi.report): the ranks' errors grouped into one line per distinct message, said by
rank 0; and g3-train's failures on 4 ranks, each one line for the job, every rank exiting non-zero."""
from __future__ import annotations

import shutil

import pytest

from g3mpi.mpi.report import agree, grouped, rank_list, report_lines, who
from tests.conftest import run_mpi
from tests.job_report import job_errors, one_error

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_one_line_for_a_job_that_fails_alike_on_4_ranks", "test_distinct_errors_one_line_each")


@pytest.mark.parametrize("ranks, text", [([0], "0"), ([0, 1, 2, 3], "0-3"), ([5, 0, 1, 2, 7, 8], "0-2,5,7-8"),
                                         ([1, 3, 5], "1,3,5"), ([], "")])
def test_rank_list(ranks, text):
    assert rank_list(ranks) == text


def test_alike_errors_are_one_line_and_distinct_ones_one_each():
    errs = ["a: bad", None, "a: bad", "b: worse", "a: bad", None]
    assert grouped(errs) == [([0, 2, 4], "a: bad"), ([3], "b: worse")]
    assert report_lines("t", errs) == ["t: error: [ranks 0,2,4] a: bad", "t: error: [rank 3] b: worse"]
    assert report_lines("t", ["x"] * 64) == ["t: error: [ranks 0-63] x"]
    assert report_lines("t", [None, None]) == [] and who([2]) == "rank 2"
    assert report_lines("t", ["", None]) == ["t: error: [rank 0] "]   # an empty message is still an error


def test_only_rank_0_writes_and_every_rank_learns_who_failed():
    errs = [None, "boom", None]
    for rank in range(3):
        out = []
        failed = agree(rank, "t", errs[rank], lambda mine: errs, write=out.append)
        assert failed == [1]
        assert out == (["t: error: [rank 1] boom"] if rank == 0 else [])
    out = []
    assert agree(0, "t", None, lambda mine: [None, None], write=out.append) == [] and out == []


def _job(tmp_path, *args):
    """g3-train on 4 ranks (tests.mpi_job_exit): (the process, every rank's exit status)."""
    codes = tmp_path / "codes"
    shutil.rmtree(codes, ignore_errors=True)
    codes.mkdir()
    p = run_mpi(4, "tests.mpi_job_exit", codes, *args, "--no-progress", check=False, timeout=180)
    return p, sorted(int((codes / f"rank-{r}").read_text()) for r in range(4) if (codes / f"rank-{r}").exists())


def test_one_line_for_a_job_that_fails_alike_on_4_ranks(tmp_path):
    """Each failure every rank finds alike is one line for the job, from rank 0, naming the ranks (it was one line
    per rank, then MPICH's abort line per rank), before any run directory; every rank exits non-zero."""
    from tests.graphs import partition, random_graph
    from tests.partition_graphs import write
    g = random_graph(n=80, f=4, c=3, seed=3)
    partition(g, 2, tmp_path / "p2", seed=1)
    partition(g, 4, tmp_path / "p4", seed=1)
    write(g, tmp_path / "g.h5")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    (tmp_path / "bad.toml").write_text("hiden = 4\n")
    run = tmp_path / "run"
    cases = [(["--parts", tmp_path / "p2"], "ranks 0-3", 1, "the partition has 2 parts but 4 ranks were started"),
             (["--parts", tmp_path / "g.h5"], "ranks 0-3", 1,
              f"is a graph file; partition it: g3-partition {tmp_path / 'g.h5'} --parts 4 --out DIR"),
             (["--parts", tmp_path / "p4", "--hiden", "4"], "ranks 0-3", 2, "did you mean '--hidden'?"),
             (["--parts", tmp_path / "p4", "--config", tmp_path / "bad.toml"], "ranks 0-3", 2,
              "unknown key 'hiden' (did you mean 'hidden'?)"),
             (["--parts", tmp_path / "p2", "--out", tmp_path / "used"], "rank 0", 1,   # (before any part is read)
              "run directory exists and is not empty")]
    for args, ranks, code, what in cases:
        p, codes = _job(tmp_path, "--out", run, *args)
        assert what in one_error(p.stderr, "g3-train", ranks), p.stderr
        assert codes == [code] * 4, p.stderr
        assert not run.exists()


def test_distinct_errors_one_line_each(tmp_path):
    """Ranks 1 and 3 each find their own part damaged: one line each, in rank order, naming its rank and file;
    the ranks that read theirs say nothing; every rank exits 1."""
    from tests.graphs import partition, random_graph
    partition(random_graph(n=80, f=4, c=3, seed=3), 4, tmp_path / "p4", seed=1)
    for r in (1, 3):
        path = tmp_path / "p4" / f"part-0000{r}.h5"
        path.write_bytes(path.read_bytes()[:-64])   # truncated
    p, codes = _job(tmp_path, "--parts", tmp_path / "p4", "--out", tmp_path / "run")
    lines = job_errors(p.stderr, "g3-train")
    assert len(lines) == 2 and codes == [1] * 4, p.stderr
    for line, r in zip(lines, (1, 3)):
        assert line.startswith(f"g3-train: error: [rank {r}] {tmp_path / 'p4' / f'part-0000{r}.h5'}: "), p.stderr
