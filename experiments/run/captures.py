"""Packet captures of a run (``mrclab run --pcap``): one pcap per host NIC port, written by tcpdump
inside the host's namespace into ``<results>/pcap/``, and with ``--debug`` on bmv2 the switches'
own per-port pcaps (BMv2's ``--pcap``) copied beside them before the fabric is torn down.

Open them with mrclab's Wireshark dissector (traffic/wireshark/mrc.lua): see :data:`HOW_TO_OPEN`.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from mrclab.emulation.cleanup import stop_processes

#: How to read the captures (printed with the run's summary and written beside them).
HOW_TO_OPEN = ("wireshark -X lua_script:{lua} -o udp.ignore_ipv6_zero_checksum:TRUE {pcap}   "
               "(or tshark -r ...; copy mrc.lua into ~/.local/lib/wireshark/plugins/ to load it always)")
DISSECTOR = Path(__file__).resolve().parents[2] / "traffic" / "wireshark" / "mrc.lua"


#: Whole frames: the fabric's jumbo MTU (9000) and its Ethernet header fit (tcpdump's -s 0 takes
#: 262,144 bytes a frame, which shrinks what its ring holds).
SNAP_BYTES = 9216
#: tcpdump's kernel buffer per port (KiB, its -B): the default 2 MiB let an unshaped MRC transfer
#: overrun it (24 of 2,234 packets "dropped by kernel" in CI).
BUFFER_KIB = 32768
#: How long tcpdump gets to open its interface (s) and how long a capture must stay unchanged before
#: it is stopped (s): stopping tcpdump discards what its kernel ring still holds.
READY_TIMEOUT_S, SETTLE_S, SETTLE_TIMEOUT_S = 10.0, 0.3, 5.0


class Captures:
    """tcpdump on every plane port of ``hosts`` while in the ``with`` block.

    Entering returns once every tcpdump is listening; leaving waits until no capture file has grown
    for :data:`SETTLE_S` (at most :data:`SETTLE_TIMEOUT_S`), then stops them. tcpdump runs in
    immediate mode: with libpcap's default buffering, the packets of the last second sit in the
    kernel ring and are lost when it is stopped (measured: a RoCE run's ACKs missing entirely).
    Each tcpdump's own report (packets captured / dropped by kernel) is kept as ``<port>.log``.
    """

    def __init__(self, fab, hosts: list[str], folder: Path) -> None:
        """Captures of ``hosts``' NIC ports on ``fab`` into ``folder`` (started by ``with``)."""
        self.fab, self.hosts, self.folder = fab, hosts, folder
        self.procs: list[subprocess.Popen] = []
        self.pcaps: list[Path] = []

    def __enter__(self) -> Captures:
        """Start one tcpdump per host NIC port and wait until each listens."""
        self.folder.mkdir(parents=True, exist_ok=True)
        logs = []
        for host in self.hosts:
            for plane in range(self.fab.spec.planes):
                intf = self.fab.plan.host_intf(host, plane)
                pcap, log = self.folder / f"{intf}.pcap", self.folder / f"{intf}.log"
                with open(log, "w") as err:  # the child keeps its own descriptor
                    self.procs.append(self.fab.emu.popen(
                        host, ["tcpdump", "-i", intf, "--immediate-mode", "-U", "-n", "-s", str(SNAP_BYTES),
                               "-B", str(BUFFER_KIB), "-w", str(pcap)],
                        stdout=subprocess.DEVNULL, stderr=err))
                self.pcaps.append(pcap)
                logs.append(log)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and not all("listening" in _text(f) for f in logs):
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.05)
        (self.folder / "README.txt").write_text(
            "One capture per host NIC port (and, with --debug on bmv2, per switch port).\n"
            "Open with mrclab's dissector:\n  " + HOW_TO_OPEN.format(lua=DISSECTOR, pcap="FILE.pcap") + "\n")
        return self

    def settle(self) -> None:
        """Wait until no capture has grown for :data:`SETTLE_S` (at most :data:`SETTLE_TIMEOUT_S`)."""
        sizes, still_since = None, time.monotonic()
        deadline = still_since + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            now = [f.stat().st_size if f.exists() else 0 for f in self.pcaps]
            if now != sizes:
                sizes, still_since = now, time.monotonic()
            elif time.monotonic() - still_since >= SETTLE_S:
                return
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        """Let the captures settle, stop tcpdump and check what it counted."""
        import psutil

        self.settle()
        live = []
        for p in self.procs:
            if p.poll() is None:
                try:
                    live.append(psutil.Process(p.pid))
                except psutil.NoSuchProcess:
                    pass
        stop_processes(live, grace_s=3.0)  # SIGTERM: tcpdump flushes its file
        for p in self.procs:
            p.poll()


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def copy_switch_pcaps(run_dir: Path, folder: Path) -> int:
    """BMv2's per-port pcaps (``<switch>-eth<port>_in.pcap`` / ``_out.pcap``) into ``folder``."""
    n = 0
    for f in sorted(Path(run_dir).glob("*.pcap")):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, folder / f.name)
        n += 1
    return n
