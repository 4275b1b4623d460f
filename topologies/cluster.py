"""A fabric over several servers, on Mininet's cluster edition (``mininet.examples.cluster``).

The cut is a plane per server (:class:`~topologies.servers.Placement`): planes never meet, so
only the host-to-T0 links cross servers. What runs where:

* **switches of a remote plane**: Mininet nodes built with the cluster edition's
  :class:`RemoteMixin` (:class:`RemoteLinuxSrv6Switch`): the node's shell is ``mnexec`` run on
  its server over ssh, in a namespace of that server, named ``mrclab-<node>`` there. Links between
  two switches of one server are veth pairs made through that shell, as on one machine. Every
  kernel call the controller makes on such a namespace (seg6 routes, qdiscs, counters, faults)
  runs on its server over one multiplexed ssh connection (topologies/kernel.py :func:`place`);
* **host-to-T0 links**: one VXLAN device at each end (this kernel has no GRE), VNI = the link's
  number, UDP port :data:`VXLAN_PORT`, made in the server's own (underlay) namespace and moved into
  the node's: one ``ip -batch`` per server for all of them (:func:`vxlan_lines`). The underlay
  must carry the fabric's 9000-byte frames plus :data:`VXLAN_OVERHEAD` bytes
  (:func:`check_underlay_mtu`). A VXLAN port has no carrier of its own: a link set down at one end
  is set down at both (:meth:`~topologies.emulation.Emulation.set_iface`), as a veth's far end
  loses carrier;
* **hosts, endpoints and the controller**: on this machine, as on one.

The cluster edition's own cleanup runs ``mn -c`` on every server, which would wipe any other
Mininet there: it is never registered (:class:`RemoteLinuxSrv6Switch` takes it back), and
:func:`~topologies.cleanup.clean` removes only what a run recorded on each server, or, asked to
look there (``mrclab clean --servers``), namespaces with this project's node names that no live
run owns.
"""

from __future__ import annotations

import os

from mininet.examples.cluster import ClusterCleanup, RemoteMixin
from mininet.link import Link
from mrclab.topologies import kernel
from mrclab.topologies.nodes import LinuxSrv6Switch
from mrclab.topologies.servers import OnServer, Server, ServerError, Ssh

#: VXLAN's UDP port (RFC 7348, IANA).
VXLAN_PORT = 4789
#: What VXLAN adds to a frame on an IPv4 underlay: outer IPv4 20 + UDP 8 + VXLAN 8 + inner
#: Ethernet 14 bytes (RFC 7348 section 5).
VXLAN_OVERHEAD = 50


class RemoteLinuxSrv6Switch(RemoteMixin, LinuxSrv6Switch):
    """A :class:`~topologies.nodes.LinuxSrv6Switch` whose shell runs on ``server`` (the cluster
    edition's :class:`RemoteMixin`), over ``ssh``'s configuration and multiplexed connection."""

    def __init__(self, name: str, server: Server, ssh: Ssh, **params) -> None:
        """Switch node ``name`` on ``server``: its shell is started there at once (Mininet's way).
        ``params`` pass to Mininet's node."""
        # RemoteMixin builds its ssh line from sshbase: ours carries the -F configuration and the
        # connection's socket, which cluster.py has no option for
        self.sshbase = ssh.base_argv() + ["-tt"]
        super().__init__(name, server=server.address, user=server.user, serverIP=server.address, **params)
        # the cluster edition registered `ssh SERVER sudo mn -c` for Mininet's cleanup: take it back
        ClusterCleanup.serveruser.pop(server.address, None)

    def startShell(self, *args, **kwargs) -> None:  # noqa: N802 - Mininet's name
        """The cluster edition's shell, without its local ``sudo -u root`` when this process is
        root already (a sudo costs a fork and a PAM session: 64 of them were a second of CPU)."""
        cmd: list[str] = getattr(self, "sshcmd")  # noqa: B009 - set by RemoteMixin, untyped there
        if self.user == "root" and os.geteuid() == 0 and cmd[:4] == ["sudo", "-E", "-u", "root"]:
            self.sshcmd = cmd[4:]
        super().startShell(*args, **kwargs)

    def _popen(self, cmd, sudo: bool = True, tt: bool = True, **params):
        """The cluster edition's remote process, with no ``sudo`` for a root login (it is root
        there already)."""
        return super()._popen(cmd, sudo=sudo and self.user != "root", tt=tt, **params)


class PreMadeLink(Link):
    """A Mininet link whose two interfaces were made beforehand (:func:`vxlan_lines`, in one batch
    per server): Mininet only records them."""

    def makeIntfPair(self, *args, **kwargs) -> None:  # noqa: N802 - Mininet's name
        """Nothing to make: the interfaces are in their nodes already."""
        return None


def vxlan_lines(name: str, mac: str, vni: int, remote_ip: str, pid: int) -> list[str]:
    """``ip -batch`` lines that make VXLAN port ``name`` (MAC ``mac``, VNI ``vni``) towards
    ``remote_ip`` in the underlay namespace the batch runs in, and move it into process ``pid``'s
    namespace."""
    return [f"link add {name} address {mac} type vxlan id {vni} remote {remote_ip} dstport {VXLAN_PORT}",
            f"link set {name} netns {pid}"]


def veth_line(name_a: str, mac_a: str, pid_a: int, name_b: str, mac_b: str, pid_b: int) -> str:
    """The ``ip -batch`` line that makes a veth pair on a server: ``name_a`` (MAC ``mac_a``) in
    process ``pid_a``'s namespace, ``name_b`` in ``pid_b``'s."""
    return (f"link add {name_a} address {mac_a} netns {pid_a} type veth peer name {name_b} address {mac_b} "
            f"netns {pid_b}")


def check_underlay(remote: OnServer, server_ip: str, mtu: int) -> str:
    """This machine's source address towards ``remote`` (at ``server_ip``), once the underlay
    between them is checked to carry frames of ``mtu`` bytes in VXLAN (``mtu`` +
    :data:`VXLAN_OVERHEAD`) at both ends. Raises ServerError naming the device to mend."""
    need = mtu + VXLAN_OVERHEAD
    try:
        dev, local_ip, have = kernel.route_to(server_ip)
        if have < need:
            raise ServerError(f"this machine: {dev}'s MTU is {have}; the fabric's {mtu}-byte frames in VXLAN "
                              f"need {need} towards {remote.name} (ip link set {dev} mtu {need})")
        rdev, _src, rhave = kernel.route_to(local_ip, remote)
    except kernel.KernelError as e:
        raise ServerError(str(e)) from None
    if rhave < need:
        raise ServerError(f"{remote.name}: {rdev}'s MTU is {rhave}; the fabric's {mtu}-byte frames in VXLAN "
                          f"need {need} (ip link set {rdev} mtu {need} there)")
    return local_ip
