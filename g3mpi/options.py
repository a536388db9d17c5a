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


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'hidden'?)`` for the closest of ``choices`` to a mistyped ``word``, or "" when none is
    close (difflib's ratio of at least 0.6)."""
    import difflib
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_options_hint(message: str, parser: argparse.ArgumentParser) -> str:
    """argparse's ``unrecognized arguments: --hiden 64`` with the options it may have meant: `` (did you mean
    '--hidden'?)`` for each unknown option that is close to one of ``parser``'s."""
    if not message.startswith("unrecognized arguments:"):
        return message
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hints = [did_you_mean(w.split("=", 1)[0], known) for w in message.split(":", 1)[1].split() if w.startswith("--")]
    return message + "".join(h for h in hints if h)
