"""p4c at run time, into a cache keyed by the program's content hash.

``compile_p4(src)`` returns the BMv2 JSON and the P4Info (text format) of ``src``, compiling only
when the cache has no entry for sha256(program text + p4c version). Cache:
``$MRCLAB_CACHE/p4/<program>-<hash>/`` (``$MRCLAB_CACHE`` defaults to ``~/.cache/mrclab``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mrclab.topologies.errors import NotAvailable, RunFailed

CACHE_ROOT = Path(os.environ.get("MRCLAB_CACHE", Path.home() / ".cache" / "mrclab")) / "p4"


class CompileError(RunFailed):
    """p4c rejected the program; the message carries p4c's own first error."""


@dataclass(frozen=True)
class CompiledProgram:
    """What :func:`compile_p4` produced: the BMv2 JSON and the P4Info (text format) of ``source``,
    the cache key ``digest`` (sha256 of the program and p4c's version, 20 hex digits)."""

    source: Path
    bmv2_json: Path
    p4info: Path
    digest: str
    cached: bool  # True when taken from the cache without running p4c


def _p4c_version() -> str:
    if shutil.which("p4c") is None:
        raise NotAvailable("p4c is not on PATH (README: \"Two data planes, one route plan\" says how to build it)")
    r = subprocess.run(["p4c", "--version"], capture_output=True, text=True)
    return (r.stdout or r.stderr).strip()


def compile_p4(src: Path) -> CompiledProgram:
    """Compile ``src`` for BMv2 v1model, or return the cached result. Raises :class:`CompileError`
    when p4c refuses it, NotAvailable when p4c is not on PATH."""
    text = src.read_bytes()
    digest = hashlib.sha256(text + _p4c_version().encode()).hexdigest()[:20]
    out = CACHE_ROOT / f"{src.stem}-{digest}"
    js, info = out / f"{src.stem}.json", out / f"{src.stem}.p4info.txt"  # p4c 1.2.4 knows .txt, not .txtpb
    if js.exists() and info.exists():
        return CompiledProgram(src, js, info, digest, cached=True)
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=CACHE_ROOT))
    try:
        cmd = ["p4c", "--target", "bmv2", "--arch", "v1model", "--std", "p4-16", "-o", str(tmp),
               "--p4runtime-files", str(tmp / info.name), str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            said = [x for x in (r.stderr or r.stdout).splitlines() if x.strip()]
            first = next((x for x in said if "error" in x.lower()), said[0] if said else f"exit {r.returncode}")
            raise CompileError(f"p4c failed on {src}: {first.strip()} ({len(said)} lines of output)")
        if not (tmp / js.name).exists():
            raise CompileError(f"p4c produced no {js.name} in {tmp}")
        try:
            tmp.rename(out)  # atomic: a half-written cache entry is never visible
        except OSError:
            if not (js.exists() and info.exists()):  # lost a race to an identical build: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return CompiledProgram(src, js, info, digest, cached=False)
