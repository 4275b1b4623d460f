"""Every error a user of mrclab can cause, under one base class that carries the exit code.

``mrclab`` catches :class:`MrclabError` once (``cli/main.py``) and prints its message as one
line on stderr, never a traceback. Each module raises the subclass that says what went wrong:

* :class:`BadInput` (exit 2): a file or option that cannot be used: a spec, a scenario, an endpoint
  config, a results folder, a missing file. The message names the file, the field and what is
  allowed, and lists every problem found in the file, not only the first.
* :class:`RunFailed` (exit 2): a valid request that failed while it ran: a fabric already running,
  p4c rejecting the program, a switch refusing a P4Runtime request, an endpoint that died. An
  error, never a verdict: not a FAIL (exit 1 is a verdict's) and never void (exit 3 is the machine's).
* :class:`NotAvailable` (exit 3): this machine cannot do it: not root, a data plane or tool missing.

An expectation that does not hold is not an error: ``mrclab run`` prints its verdict and exits 1.
"""

from __future__ import annotations


class MrclabError(Exception):
    """Base of mrclab's errors; ``exit_code`` is what ``mrclab`` exits with."""

    exit_code = 2

    def one_line(self) -> str:
        """The message on one line (continuation lines joined with ' | ')."""
        lines = [x.strip() for x in str(self).splitlines() if x.strip()]
        return " | ".join(lines) or type(self).__name__


class BadInput(MrclabError, ValueError):
    """A file, field or option that cannot be used (exit 2)."""

    exit_code = 2


class RunFailed(MrclabError, RuntimeError):
    """A valid request that failed while it ran: a crash, an error (exit 2)."""

    exit_code = 2


class NotAvailable(MrclabError, RuntimeError):
    """This machine cannot do what was asked: not root, a data plane or tool missing (exit 3)."""

    exit_code = 3
