"""Results folders: where a run, a sweep or a report writes, and the rule that nothing is overwritten.

A folder is ``results/<name>-<YYYYmmdd-HHMMSS>`` unless the user names one (``--out``); a folder
that exists and holds anything is refused before anything runs (:class:`BadInput`, exit 2), so no
earlier result is ever lost.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from mrclab.topologies.errors import BadInput

RESULTS_ROOT = Path("results")


def results_folder(out: Path | str | None, name: str) -> Path:
    """``out``, or ``results/<name>-<time>``, made and empty. Raises :class:`BadInput` when it
    exists and is not empty (nothing is overwritten)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = Path(out) if out else RESULTS_ROOT / f"{name}-{stamp}"
    if folder.exists() and any(folder.iterdir()):
        raise BadInput(f"results folder {folder} exists and is not empty; choose another --out (nothing overwritten)")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
