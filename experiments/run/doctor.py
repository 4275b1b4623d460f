"""``mrclab doctor``: what this machine has for mrclab, which data planes and scenario features it
can run, and for each missing piece the one line that installs it.

Each check is (name, found: bool, detail, the line that installs it). Checks that need root (the
qdiscs, which a temporary namespace tries) say so when not root. Exit code 0 when at least one data
plane can run, 3 (this machine cannot) otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from mrclab.controller import bpf, thrift
from mrclab.controller.dataplanes import DATAPLANES
from mrclab.emulation import kernel, servers
from mrclab.experiments.run.admission import load_calibration
from rich.console import Console
from rich.table import Table

console = Console(highlight=False)
APT = "apt-get install -y"
TOOLCHAIN = "sudo vagrant/build-toolchain.sh   (p4c, PI, BMv2 with Thrift; about 45 minutes)"


@dataclass(frozen=True)
class Check:
    """One thing mrclab needs: its name, whether it is here, what was found, how to install it."""
    name: str
    found: bool
    detail: str
    install: str = ""


def _version(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    out = (r.stdout or r.stderr).strip().splitlines()
    return out[0][:60] if out else ""


def _binary(name: str, install: str, version_arg: str | None = "--version") -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, False, "not on PATH", install)
    return Check(name, True, _version([path, version_arg]) if version_arg else path, install)


def _qdiscs() -> list[Check]:
    """htb, tbf and clsact tried on a veth in a throwaway namespace (root only)."""
    if os.geteuid() != 0:
        return [Check("qdiscs htb, tbf, clsact", False, "not checked: needs root", "run mrclab doctor as root")]
    ns = f"mrclab-doctor-{uuid.uuid4().hex[:6]}"
    out = []
    try:
        kernel.netns_add(ns)
        kernel.veth_add(ns, "d0", ns, "d1")
        for q, args in (("tbf", ["root", "tbf", "rate", "1mbit", "burst", "3000", "limit", "30000"]),
                        ("htb", ["root", "handle", "1:", "htb"]), ("clsact", ["clsact"])):
            try:
                kernel.tc(ns, ["qdisc", "replace", "dev", "d0", *args])
                out.append(Check(f"qdisc {q}", True, "ok", "a kernel with CONFIG_NET_SCH_" + q.upper()))
            except kernel.KernelError as e:
                out.append(Check(f"qdisc {q}", False, str(e).split(": ")[-1][:60],
                                 "a kernel with CONFIG_NET_SCH_" + q.upper()))
    except (OSError, kernel.KernelError) as e:
        out.append(Check("qdiscs", False, f"cannot make a test namespace ({e})", "run as root with iproute2"))
    finally:
        kernel.netns_delete(ns)
    return out


def checks() -> list[Check]:
    """Every check of this machine (root, Mininet, iproute2, IPv6, qdiscs, clang, the P4 toolchain, captures)."""
    out = [Check("root", os.geteuid() == 0, "yes" if os.geteuid() == 0 else "no: namespaces need root",
                 "sudo -i")]
    try:
        import mininet  # noqa: F401

        out.append(Check("Mininet", True, "importable", APT + " mininet"))
    except ImportError:
        out.append(Check("Mininet", False, "not importable", APT + " mininet   (then ./setup.sh)"))
    out.append(_binary("ip", APT + " iproute2", "-V"))
    out.append(_binary("tc", APT + " iproute2", "-V"))
    ipv6 = os.path.exists("/proc/sys/net/ipv6/conf/all/forwarding")
    out.append(Check("kernel IPv6 forwarding", ipv6, "present" if ipv6 else "no IPv6 in this kernel",
                     "a kernel with CONFIG_IPV6"))
    out += _qdiscs()
    why = bpf.bpf_missing()
    out.append(Check("clang + libbpf (linux data plane: uN SID and queues; NIC drain watch)", why is None,
                     _version(["clang", "--version"]) if why is None else why,
                     APT + " clang libbpf-dev"))
    out.append(_binary("p4c", TOOLCHAIN))
    out.append(_binary("simple_switch_grpc", TOOLCHAIN))
    if shutil.which("simple_switch_grpc"):
        tw = thrift.thrift_missing()
        out.append(Check("BMv2 Thrift runtime (bmv2 queues)", tw is None, "ok" if tw is None else tw,
                         TOOLCHAIN + "; then ./setup.sh"))
    out.append(_binary("tcpdump", APT + " tcpdump"))
    out.append(_binary("tshark", APT + " tshark", "-v"))
    return out


def planes() -> dict[str, tuple[bool, str, str]]:
    """data plane -> (can run, features available, what is missing and why)."""
    root_ok = os.geteuid() == 0 and shutil.which("ip") is not None
    out = {}
    for plane in DATAPLANES.values():
        why_not = "" if root_ok else "needs root and iproute2"
        if tm := plane.missing():
            why_not = tm
        missing = plane.missing_features()
        have = sorted(plane.features - set(missing))
        said = [why_not] + [f"{k}: {v}" for k, v in sorted(missing.items())]
        out[plane.name] = (not why_not, ", ".join(have), "; ".join(x for x in said if x))
    return out


def _server_gaps(plane: str, check: servers.ServerCheck) -> dict[str, str]:
    """Feature -> why data plane ``plane`` lacks it on the server ``check`` judged: what the
    server lacks for it, and what the data plane has not built over servers."""
    return {**dict(check.lacks), **DATAPLANES[plane].remote_missing}


def servers_table(servers_text: str, ssh_config: str | None) -> int:
    """``mrclab doctor --servers A,B``: every server's reachability, tools and clock against this
    machine's, for both data planes (emulation/servers.py); exit 0 when every server can carry
    a linux fabric, 3 otherwise. Raises BadInput for a malformed server list."""
    found = servers.parse_servers(servers_text)
    ssh = servers.Ssh(Path(tempfile.mkdtemp(prefix="mrclab-ssh-")), Path(ssh_config) if ssh_config else None)
    try:
        linux, bmv2 = (servers.preflight(ssh, found, DATAPLANES[p].server_tools(), DATAPLANES[p].server_features(),
                                         DATAPLANES[p].server_needs()) for p in ("linux", "bmv2"))
    finally:
        ssh.close()
        shutil.rmtree(ssh.control_dir, ignore_errors=True)
    t = Table(title="mrclab doctor: servers")
    for col in ("server", "linux", "bmv2", "clock offset", "round trip", "features lacking", "problems"):
        t.add_column(col)
    lacking: list[str] = []
    for lc, bc in zip(linux, bmv2, strict=True):
        extra = [p for p in bc.problems if p not in lc.problems]
        gaps = {"linux": _server_gaps("linux", lc), "bmv2": _server_gaps("bmv2", bc)}
        lacking += [f"{lc.server.name}: {plane} over servers lacks {f} ({why})"
                    for plane, g in gaps.items() for f, why in g.items()]
        t.add_row(lc.server.name, "[green]ok[/green]" if not lc.problems else "[red]no[/red]",
                  "[green]ok[/green]" if not bc.problems else "[red]no[/red]",
                  f"{lc.offset_s * 1e3:+.1f} ms" if lc.offset_s is not None else "-",
                  f"{lc.rtt_s * 1e3:.1f} ms" if lc.rtt_s is not None else "-",
                  "; ".join(f"{plane}: {', '.join(sorted(g))}" for plane, g in gaps.items() if g) or "-",
                  "; ".join(p.split(": ", 1)[1] for p in lc.problems + tuple(extra)) or "-")
    console.print(t)
    # each problem whole on a line of its own (the table wraps them): linux's, then what bmv2 adds,
    # then each feature a server cannot give a data plane, with why
    seen = [p for c in linux for p in c.problems]
    for p in seen + [p for c in bmv2 for p in c.problems if p not in seen] + lacking:
        console.print(p, soft_wrap=True, highlight=False, markup=False)
    return 0 if all(not c.problems for c in linux) else 3


def main(args=None) -> int:
    """``mrclab doctor``: the checks, the data planes and their features, the calibration; exit 3
    when no data plane runs. With ``--servers``, the servers instead (:func:`servers_table`)."""
    if args is not None and getattr(args, "servers", None):
        return servers_table(args.servers, getattr(args, "ssh_config", None))
    t = Table(title="mrclab doctor: this machine")
    for col in ("", "piece", "found", "install with"):
        t.add_column(col)
    for chk in checks():
        t.add_row("[green]ok[/green]" if chk.found else "[red]--[/red]", chk.name, chk.detail,
                  "" if chk.found else chk.install)
    console.print(t)
    p = Table(title="data planes and scenario features")
    for col in ("data plane", "runs", "features", "missing"):
        p.add_column(col)
    pl = planes()
    for dp, (ok, have, missing) in pl.items():
        p.add_row(dp, "yes" if ok else "[red]no[/red]", have if ok else "-", missing or "-")
    console.print(p)
    c = Table(title="what this machine sustains (mrclab calibrate; runs are admitted against it)")
    for col in ("data plane", "calibrated", "endpoint start (CPU-s)", "endpoint idle (cores)",
                "endpoint us/pkt send, receive", "switch us/pkt/hop", "switch idle (cores)"):
        c.add_column(col)
    for dp in ("linux", "bmv2"):
        cal = load_calibration(dp)
        if cal is None:
            c.add_row(dp, "[yellow]not yet[/yellow] (mrclab calibrate)", "-", "-", "-", "-", "-")
        else:
            c.add_row(dp, cal.when, f"{cal.endpoint_start_cpu_s:.2f}", f"{cal.endpoint_idle_cores:.3f}",
                      f"{cal.endpoint_tx_us:.1f}, {cal.endpoint_rx_us:.1f}", f"{cal.switch_us_per_hop:.1f}",
                      f"{cal.switch_idle_cores:.3f}")
    console.print(c)
    return 0 if any(ok for ok, _, _ in pl.values()) else 3
