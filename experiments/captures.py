"""Packet captures of a run (``mrclab run --pcap``): one pcap per host NIC port, written by tcpdump
inside the host's namespace into ``<results>/pcap/``, and with ``--debug`` on bmv2 the switches'
own per-port pcaps (BMv2's ``--pcap``) copied beside them before the fabric is torn down.

Open them with mrclab's Wireshark dissector (traffic/wireshark/mrc.lua): see :data:`HOW_TO_OPEN`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from topologies.cleanup import stop_processes

#: How to read the captures (printed with the run's summary and written beside them).
HOW_TO_OPEN = ("wireshark -X lua_script:{lua} -o udp.ignore_ipv6_zero_checksum:TRUE {pcap}   "
               "(or tshark -r ...; copy mrc.lua into ~/.local/lib/wireshark/plugins/ to load it always)")
DISSECTOR = Path(__file__).resolve().parent.parent / "traffic" / "wireshark" / "mrc.lua"


class Captures:
    """tcpdump on every plane port of ``hosts`` while in the ``with`` block."""

    def __init__(self, fab, hosts: list[str], folder: Path) -> None:
        self.fab, self.hosts, self.folder = fab, hosts, folder
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Captures:
        self.folder.mkdir(parents=True, exist_ok=True)
        for host in self.hosts:
            for plane in range(self.fab.spec.planes):
                intf = self.fab.plan.host_intf(host, plane)
                self.procs.append(self.fab.emu.popen(
                    host, ["tcpdump", "-i", intf, "-U", "-s", "0", "-w", str(self.folder / f"{intf}.pcap")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        (self.folder / "README.txt").write_text(
            "One capture per host NIC port (and, with --debug on bmv2, per switch port).\n"
            "Open with mrclab's dissector:\n  " + HOW_TO_OPEN.format(lua=DISSECTOR, pcap="FILE.pcap") + "\n")
        return self

    def __exit__(self, *exc) -> None:
        import psutil

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


def copy_switch_pcaps(run_dir: Path, folder: Path) -> int:
    """BMv2's per-port pcaps (``<switch>-eth<port>_in.pcap`` / ``_out.pcap``) into ``folder``."""
    n = 0
    for f in sorted(Path(run_dir).glob("*.pcap")):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, folder / f.name)
        n += 1
    return n
