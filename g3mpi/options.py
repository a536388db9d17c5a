"""What the command lines share: their settings dataclasses built from the parsed options. Outside ``g3mpi.cli``
so that the data tools (``g3-prepare``), the CLI and the bench all import it without depending on each other."""
from __future__ import annotations

import argparse
from dataclasses import fields


def from_options(cls, options, **fixed):
    """A ``cls`` (a frozen dataclass of settings) from the parsed command line ``options`` (an argparse Namespace,
    or a dict of its values): each field the command line gave (not None), and ``fixed``; the other fields keep
    the dataclass's defaults. The parsers leave an option not given as None, so the defaults live in one place."""
    given = vars(options) if isinstance(options, argparse.Namespace) else options
    return cls(**{f.name: given[f.name] for f in fields(cls) if given.get(f.name) is not None}, **fixed)
