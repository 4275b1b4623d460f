"""How every ``mrclab bench`` prints its tables: for a person (a rich table on stdout) or, with
``--markdown``, as Markdown for docs/benchmarks.md, headed with the command, the date, the commit
and the machine that printed it, so that a table there is always one a command printed.

Progress goes to stderr (:data:`progress`), so ``mrclab bench X --markdown > t.md`` keeps only the
tables; a benchmark runs scenarios through :func:`run_scenario`, whose per-run summary is progress too.
"""
from __future__ import annotations

import contextlib
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mrclab.controller.dataplanes import dataplane as resolve
from mrclab.experiments.run import runner
from mrclab.experiments.run.reproduce import provenance
from rich.console import Console
from rich.table import Table

progress = Console(stderr=True, highlight=False)
_out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)  # a log keeps whole rows


def markdown(t: Table) -> str:
    """``t`` as a Markdown table: its title in bold above, one row per row, cells as printed."""
    head = [str(c.header) for c in t.columns]
    cells = [[str(c) for c in col._cells] for col in t.columns]  # rich keeps a column's cells in order
    rows = list(zip(*cells)) if cells else []
    lines = [f"**{t.title}**", ""] if t.title else []
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(r).replace("\n", " ") + " |" for r in rows]
    return "\n".join(lines)


def header(argv: list[str] | None = None) -> str:
    """The line that heads a ``--markdown`` printout: ``mrclab bench ...`` as typed (``argv``, default
    this process's), today's date, the commit (``git describe``; ``unknown`` outside a checkout) and
    the machine (cores, memory, CPU, kernel)."""
    p = provenance()
    words = (argv if argv is not None else sys.argv)[1:]
    cmd = shlex.join(["mrclab", *words])
    return f"`{cmd}`, {time.strftime('%Y-%m-%d')}, commit {p['commit'] or 'unknown'}, {p['machine']}"


def emit(tables: list[Table], notes: list[str], as_markdown: bool) -> None:
    """Print ``tables`` then ``notes`` (plain lines: targets, what the figures mean): for a person, or
    with ``as_markdown`` as one Markdown block headed by :func:`header`."""
    if as_markdown:
        blocks = [header(), *(markdown(t) for t in tables), *notes]
        print("\n\n".join(blocks))
        return
    for t in tables:
        _out.print(t)
    for n in notes:
        _out.print(n)


def run_scenario(scn, out, **kw):
    """:func:`~experiments.run.runner.run_with_data` for a benchmark (``live=False``; ``kw`` passed
    on): the run's own summary (verdict table, totals, regime) goes to stderr with the progress,
    so stdout keeps only the benchmark's tables. Returns (metrics, run data); raises as it does."""
    with contextlib.redirect_stdout(sys.stderr):
        return runner.run_with_data(scn, out, live=False, **kw)


def per_dataplane(dps: list[str], prefix: str, measure: Callable[[str, Path], Table]) -> list[Table]:
    """``measure(dp, folder)``'s table for each data plane of ``dps`` this machine has (one missing
    is skipped, said on stderr), every run's folder under one temporary ``prefix`` folder that is
    removed afterwards."""
    tables = []
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        for dp in dps:
            if why := resolve(dp).missing():
                progress.print(f"[yellow]{dp}: skipped ({why})[/yellow]")
                continue
            tables.append(measure(dp, Path(d)))
    return tables
