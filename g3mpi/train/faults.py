"""Faults during training: coordinated failures, non-finite values, and the test-only fault injection hooks.

``TrainingFault`` is raised on *every* rank at the same point (the ranks agreed on it through a value they all
hold, e.g. the allreduced gradient buffer), so the command line can print one line per rank and exit non-zero
cleanly, without ``MPI_Abort``. Anything else raised on one rank is a local failure and aborts the job.

Test-only hooks (environment variables, read once when a trainer starts; never set them in production):
  ``G3_TEST_STALL=RANK:WHEN:SECONDS``   rank RANK (``*``: every rank) sleeps SECONDS at the start of epoch WHEN
                                        (``every``: of every epoch, a slow run of known length for time-limit
                                        tests), or at the point WHEN names (``STALL_POINTS``: ``startup``, before the
                                        start-up halo check; ``evaluation``, before each evaluation;
                                        ``checkpoint``, before each checkpoint; ``predictions``, in its turn writing
                                        predictions.h5, before it writes; ``exit``, after a stop, just before
                                        the process exits with 75) (watchdog and launcher tests)
  ``G3_TEST_NAN=RANK:EPOCH[:PARAM]``    rank RANK's loss (or the gradient of parameter PARAM) becomes NaN at
                                        epoch EPOCH (numerical-fault tests)
  ``G3_TEST_PIDFILE=DIR``               every rank writes its pid to DIR/rank-R.pid (rank-failure tests)
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

#: the named points where G3_TEST_STALL can make a rank sleep (besides the start of an epoch)
STALL_POINTS = ("startup", "evaluation", "checkpoint", "predictions", "exit")
#: G3_TEST_STALL's WHEN for the start of every epoch
EVERY_EPOCH = "every"


class TrainingFault(RuntimeError):
    """A failure every rank detected together; ``str(e)`` is this rank's one-line message."""


def first_nonfinite(loss: torch.Tensor, named_params) -> str | None:
    """``"loss"`` if the (local) loss is not finite, else the name of the first parameter whose gradient has a
    NaN or Inf, else None."""
    if not bool(torch.isfinite(loss).all()):
        return "loss"
    for name, p in named_params:
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return name
    return None


def _parse(var: str, spec: str, n: int, types):
    parts = spec.split(":")
    if not n <= len(parts) <= len(types):
        raise ValueError(f"{var}={spec!r}: expected {':'.join(t.__name__.upper() for t in types)}")
    try:
        return [t(v) for t, v in zip(types, parts)]
    except ValueError:
        raise ValueError(f"{var}={spec!r}: expected {':'.join(t.__name__.upper() for t in types)}") from None


@dataclass(frozen=True)
class TestHooks:
    """Test-only fault injection for one rank (all off unless the G3_TEST_* variables are set)."""

    __test__ = False  # not a pytest class

    rank: int = 0
    stall: tuple | None = None     # (epoch or one of STALL_POINTS, seconds)
    nan: tuple | None = None       # (epoch, "loss" or parameter name)

    @classmethod
    def from_env(cls, rank: int, env=None) -> "TestHooks":
        env = os.environ if env is None else env
        stall = nan = None
        if env.get("G3_TEST_STALL"):
            r, e, s = _parse("G3_TEST_STALL", env["G3_TEST_STALL"], 3, (str, str, float))
            try:
                r = rank if r == "*" else int(r)
            except ValueError:
                raise ValueError(f"G3_TEST_STALL={env['G3_TEST_STALL']!r}: RANK must be a rank or *") from None
            if e not in (*STALL_POINTS, EVERY_EPOCH):
                try:
                    e = int(e)
                except ValueError:
                    raise ValueError(f"G3_TEST_STALL={env['G3_TEST_STALL']!r}: WHEN must be an epoch, "
                                     f"{EVERY_EPOCH} or one of {', '.join(STALL_POINTS)}") from None
            stall = (e, s) if r == rank else None
        if env.get("G3_TEST_NAN"):
            r, e, *what = _parse("G3_TEST_NAN", env["G3_TEST_NAN"], 2, (int, int, str))
            nan = (e, what[0] if what else "loss") if r == rank else None
        if env.get("G3_TEST_PIDFILE"):
            d = Path(env["G3_TEST_PIDFILE"])
            (d / f"rank-{rank}.pid").write_text(f"{os.getpid()}\n")
        return cls(rank=rank, stall=stall, nan=nan)

    def epoch_start(self, epoch: int) -> None:
        self.stall_at(EVERY_EPOCH if self.stall and self.stall[0] == EVERY_EPOCH else epoch)

    def stall_at(self, when) -> None:
        """Sleep here if G3_TEST_STALL names this rank and ``when`` (an epoch or one of STALL_POINTS)."""
        if self.stall and self.stall[0] == when:
            time.sleep(self.stall[1])

    def corrupt_loss(self, epoch: int, loss: torch.Tensor) -> torch.Tensor:
        if self.nan and self.nan[0] == epoch and self.nan[1] == "loss":
            return loss * float("nan")
        return loss

    def corrupt_grads(self, epoch: int, named_params) -> None:
        if self.nan and self.nan[0] == epoch and self.nan[1] != "loss":
            for name, p in named_params:
                if name == self.nan[1]:
                    p.grad.view(-1)[0] = float("inf")
                    return
            raise ValueError(f"G3_TEST_NAN: no parameter named {self.nan[1]!r}")
