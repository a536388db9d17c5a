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


def _long_options(parser: argparse.ArgumentParser, argv=None) -> list[str]:
    """``parser``'s ``--long`` options and its subcommands': the one ``argv`` names, else all of them."""
    found = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            chosen = [a.choices[w] for w in argv or () if w in a.choices][:1] or a.choices.values()
            for sub in chosen:
                found += [o for o in _long_options(sub) if o not in found]
    return found


def unknown_options_hint(message: str, parser: argparse.ArgumentParser, argv=None) -> str:
    """argparse's ``unrecognized arguments: --hiden 64`` with the options it may have meant: `` (did you mean
    '--hidden'?)`` for each unknown option that is close to one of ``parser``'s (or its subcommand's). ``argv``,
    the words ``parser`` parsed: an unknown option among them is named instead of what argparse reports first,
    a missing required argument or a value it took for a positional (``--metod metis`` said only that --parts
    and --out were missing)."""
    known = _long_options(parser, argv)
    if argv is not None and not message.startswith("unrecognized arguments:"):
        unknown = [w for w in argv if w.startswith("--") and w != "--" and w.split("=", 1)[0] not in known]
        if unknown:
            message = f"unrecognized arguments: {' '.join(unknown)}"
    if not message.startswith("unrecognized arguments:"):
        return message
    hints = [did_you_mean(w.split("=", 1)[0], known) for w in message.split(":", 1)[1].split() if w.startswith("--")]
    return message + "".join(h for h in hints if h)


class Parser(argparse.ArgumentParser):
    """The argument parser of every g3 command: no prefix abbreviation (``--epoch`` is not taken as ``--epochs``)
    and a bad command line is one line, ``PROG: error: MESSAGE (did you mean '--method'?) (PROG --help lists the
    options)``, exit status 2, without the usage. Subcommands (``add_subparsers``) get the same parser."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        import sys
        self._argv = list(sys.argv[1:] if args is None else args)   # for error(): the unknown options
        return super().parse_known_args(args, namespace)

    def error_line(self, message: str) -> str:
        """The one line of a bad command line, without ``PROG: error:``."""
        message = unknown_options_hint(message, self, getattr(self, "_argv", None))
        top = self.prog.split()[0]
        return f"{message} ({top} --help lists the options)"

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {self.error_line(message)}\n")
