"""One error format for every command line (g3mpi.options.Parser): one line naming the program, "did you mean"
for a mistyped option, no prefix abbreviation, exit status 2, no usage."""
import importlib

import pytest

SLOW_TESTS = ("test_one_line_with_did_you_mean[g3mpi.cli.report---tabel]",)

# (console script's module:function, argv, the line's expected text after "PROG: error: ")
CASES = [
    ("data_tools.partition:main", ["g.h5", "--metod", "metis"],
     "unrecognized arguments: --metod (did you mean '--method'?)"),
    ("data_tools.prepare:main", ["npz", "cora.npz", "--feature"],
     "unrecognized arguments: --feature (did you mean '--feature-dtype'?)"),
    ("data_tools.prepare:main", ["--feature"], "unrecognized arguments: --feature (did you mean"),
    ("data_tools.inspection:main", ["parts", "--jsn"], "unrecognized arguments: --jsn (did you mean '--json'?)"),
    ("g3mpi.bench.cli:main", ["vs-pyg", "--epoch", "3"], "unrecognized arguments: --epoch (did you mean '--epochs'?)"),
    ("g3mpi.cli.sweep:main", ["--gird", "x"], "unrecognized arguments: --gird"),
    ("g3mpi.cli.report:main", ["--tabel"], "unrecognized arguments: --tabel"),
]


@pytest.mark.parametrize("target,argv,expected", CASES, ids=[f"{c[0].split(':')[0]}-{c[1][-1]}" for c in CASES])
def test_one_line_with_did_you_mean(capsys, target, argv, expected):
    mod, fn = target.split(":")
    with pytest.raises(SystemExit) as e:
        getattr(importlib.import_module(mod), fn)(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    prog = err.split(": error: ")[0]
    assert prog.startswith("g3-") and expected in err and err.endswith(f"({prog.split()[0]} --help lists the options)\n")


def test_no_prefix_abbreviation():
    """--epoch is not taken for --epochs (argparse's default allow_abbrev), in g3-train nor anywhere else."""
    from g3mpi.cli.train import BadCommandLine, build_parser
    with pytest.raises(BadCommandLine, match=r"unrecognized arguments: --epoch 10 \(did you mean '--epochs'\?\)"):
        build_parser().parse_args(["--parts", "p", "--out", "o", "--epoch", "10"])
    assert build_parser().parse_args(["--epochs", "10"]).epochs == 10
    from data_tools.cli import partition_parser, prepare_parser
    for ap in (partition_parser(), prepare_parser()):
        assert ap.allow_abbrev is False
    with pytest.raises(SystemExit):
        partition_parser().parse_args(["g.h5", "--parts", "2", "--out", "o", "--meth", "metis"])
