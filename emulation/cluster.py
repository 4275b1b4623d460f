"""A fabric over several servers, on Mininet's cluster edition (``mininet.examples.cluster``).

The cut is a plane per server (:class:`~emulation.servers.Placement`): planes never meet, so
only the host-to-T0 links cross servers. What runs where:

* **switches of a remote plane**: Mininet nodes built with the cluster edition's
  :class:`RemoteMixin` (:class:`OnServerMixin`: :class:`RemoteLinuxSrv6Switch`,
  :class:`RemoteBmv2Switch`): the node's shell is ``mnexec`` run on its server over ssh, in a
  namespace of that server, named ``mrclab-<node>`` there. Every kernel call the controller makes
  on such a namespace (routes, qdiscs, counters, faults) runs on its server through that
  server's agent (emulation/kernel.py :func:`place`, emulation/servers.py ``OnServer``). A bmv2
  switch runs there too, its P4Runtime socket forwarded here over ssh;
* **links**: inside a server, veth pairs (:func:`veth_line`); between a host and a remote T0, one
  VXLAN port at each end (this kernel has no GRE), VNI = the link's number, UDP port
  :data:`VXLAN_PORT` (:func:`vxlan_lines`), made in its node's namespace at once with the tunnel's
  socket in the server's own (underlay) namespace. All of a server's are made by one
  ``ip -batch``. The underlay must carry the fabric's 9000-byte frames plus
  :data:`VXLAN_OVERHEAD` bytes (:func:`check_underlay`). A VXLAN port has no carrier of its own:
  the host's end is up only while both ends are set up, as a veth's carrier would be
  (:meth:`~emulation.network.Emulation.set_iface`);
* **hosts, endpoints and the controller**: on this machine, as on one.

The cluster edition's own cleanup runs ``mn -c`` on every server, which would wipe any other
Mininet there: it is never registered (:class:`OnServerMixin` takes it back), and
:func:`~emulation.cleanup.clean` removes only what a run recorded on each server, or, asked to
look there (``mrclab clean --servers``), namespaces with this project's node names that no live
run owns.
"""

from __future__ import annotations

import os
import shlex
import time
import tty
from pathlib import Path

from mininet.examples.cluster import ClusterCleanup, RemoteMixin
from mininet.link import Link
from mininet.node import Switch
from mrclab.emulation import kernel
from mrclab.emulation.nodes import BMV2_BINARY, Bmv2Switch, EmulationError, LinuxSrv6Switch
from mrclab.emulation.servers import OnServer, Server, ServerError, Ssh

#: VXLAN's UDP port (RFC 7348, IANA).
VXLAN_PORT = 4789
#: What VXLAN adds to a frame on an IPv4 underlay: outer IPv4 20 + UDP 8 + VXLAN 8 + inner
#: Ethernet 14 bytes (RFC 7348 section 5).
VXLAN_OVERHEAD = 50


class OnServerMixin(RemoteMixin):
    """The cluster edition's :class:`RemoteMixin` over ``ssh``'s configuration and multiplexed
    connection, without its ``sudo`` for a root login, and without the ``mn -c`` it registers."""

    def __init__(self, name: str, server: Server, ssh: Ssh, **params) -> None:
        """Node ``name`` on ``server``: its shell is started there at once (Mininet's way).
        ``params`` pass to Mininet's node."""
        # RemoteMixin builds its ssh line from sshbase: ours carries the -F configuration and the
        # connection's socket, which cluster.py has no option for
        self.sshbase = ssh.base_argv() + ["-tt"]
        self.mrclab_server = server
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
        there already).

        The node's shell (Mininet's ``startShell`` hands the pty it opened as stdin) gets that
        local pty in raw mode before ``ssh -tt`` starts. ssh puts its terminal in raw mode itself,
        but over a multiplexed connection the master starts relaying the remote shell's output
        before the client has done so: a command Mininet writes in that window is echoed by the
        local pty's line discipline, and its output gets a second carriage return
        (``'echo $$\r\n12901\r\r\n'``, which Mininet's ``int()`` of the shell's pid refused: one
        remote switch start in five here, 2026-12-05)."""
        pty_fd = params.get("stdin")
        if getattr(self, "isRemote", False) and isinstance(pty_fd, int) and pty_fd == getattr(self, "slave", None):
            tty.setraw(pty_fd)
        return super()._popen(cmd, sudo=sudo and self.user != "root", tt=tt, **params)


class RemoteLinuxSrv6Switch(OnServerMixin, LinuxSrv6Switch):
    """A :class:`~emulation.nodes.LinuxSrv6Switch` whose shell runs on its server."""


#: What runs beside a bmv2 switch with Thrift on a server, inside its namespace (``python3 -c``,
#: argv: Thrift socket, Thrift port, control socket). It relays every
#: connection to the Thrift socket (a unix socket in the run's folder there, which ssh forwards
#: here) to ``127.0.0.1:<port>`` in the namespace, where BMv2 listens and ssh cannot reach; and
#: answers one line per line on the control socket: ``qlen`` -> ``dev=packets ...`` of every tbf
#: in the namespace (one ``tc -s -j``), ``kick DEV HEX`` -> the frame HEX sent out of DEV (a raw
#: socket kept per port; the PFC agent's kick, controller/pfc.py), ``0``; a failure -> ``error ...``.
#: The relay's TCP side sends at once (TCP_NODELAY): a request that reaches it in two pieces would
#: otherwise wait for the first one's delayed acknowledgement. Its reads block for as long as a
#: session idles (the 5 s is the connect's only: a read timing out closed the session, and every
#: later read of that switch's counters failed, on 64 switches read 4 s apart).
SWITCH_HELPER = """import json,os,socket,subprocess,sys,threading
ts,port,cs=sys.argv[1],int(sys.argv[2]),sys.argv[3]
def pipe(a,b):
 try:
  while True:
   d=a.recv(65536)
   if not d:break
   b.sendall(d)
 except OSError:pass
 for x in(a,b):
  try:x.shutdown(socket.SHUT_RDWR)
  except OSError:pass
def relay(c):
 try:u=socket.create_connection(('127.0.0.1',port),5)
 except OSError:
  c.close();return
 u.settimeout(None)
 u.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)
 t=threading.Thread(target=pipe,args=(u,c),daemon=True);t.start();pipe(c,u);t.join();c.close();u.close()
def ctl(c):
 f=c.makefile('rw');raw={}
 for line in f:
  w=line.split()
  try:
   if w[0]=='kick':
    s=raw.get(w[1])
    if s is None:
     s=raw[w[1]]=socket.socket(socket.AF_PACKET,socket.SOCK_RAW);s.bind((w[1],0))
    s.send(bytes.fromhex(w[2]));a='0'
   else:
    q=json.loads(subprocess.run(['tc','-s','-j','qdisc','show'],capture_output=True,text=True).stdout or '[]')
    a=' '.join('%s=%d'%(x.get('dev','?'),x.get('qlen',0)) for x in q if x.get('kind')=='tbf')
  except(OSError,ValueError,IndexError)as e:a='error '+str(e).replace(chr(10),' ')
  f.write(a+chr(10));f.flush()
 c.close()
def serve(path,fn):
 try:os.unlink(path)
 except OSError:pass
 l=socket.socket(socket.AF_UNIX);l.bind(path);l.listen(64)
 while True:
  c,_=l.accept();threading.Thread(target=fn,args=(c,),daemon=True).start()
threading.Thread(target=serve,args=(cs,ctl),daemon=True).start()
serve(ts,relay)
"""


class RemoteBmv2Switch(OnServerMixin, Bmv2Switch):
    """A :class:`~emulation.nodes.Bmv2Switch` on ``server``: ``simple_switch_grpc`` runs in the
    node's namespace there, its P4Runtime on a unix socket in ``remote_dir`` on that server, which
    ssh forwards to :attr:`grpc_addr` here (``ssh -O forward -L``, over the server's multiplexed
    connection): the controller speaks to it as to a local switch. Its output goes to
    ``<remote_dir>/<name>.out`` there. No per-packet debug log.

    With ``thrift_port`` (switch queues), :data:`SWITCH_HELPER` runs beside it in its namespace
    there: it relays a unix socket in ``remote_dir`` to the switch's Thrift port, and answers the
    PFC agent's two asks on another (the tbf levers' queue lengths; a kick frame out of a port).
    ssh forwards both here as it does P4Runtime's: :attr:`thrift_addr` and :attr:`control_addr`
    (controller/thrift.py, controller/pfc.py)."""

    def __init__(self, name: str, server: Server, ssh: Ssh, remote: OnServer, remote_dir: str, **params) -> None:
        """Switch node ``name`` on ``server`` (its shell started there at once); ``remote``: the
        server's agent; ``remote_dir``: the run's folder there. ``params``: :class:`Bmv2Switch`'s."""
        self.ssh_session, self.on_server, self.remote_dir = ssh, remote, remote_dir
        self.forwarded = False
        super().__init__(name, server=server, ssh=ssh, **params)

    @property
    def listen_addr(self) -> str:
        """The switch's own P4Runtime socket, on its server."""
        return f"unix:{self.remote_dir}/{self.name}.grpc"

    @property
    def pid_file(self) -> str:
        """Where the switch process writes its pid on its server."""
        return f"{self.remote_dir}/{self.name}.pid"

    def binary(self) -> str:
        """``simple_switch_grpc`` as the server's PATH finds it (its own install)."""
        return BMV2_BINARY

    @property
    def out_file(self) -> str:
        """The switch's output on its server (warnings and errors)."""
        return f"{self.remote_dir}/{self.name}.out"

    def start(self, controllers=None) -> None:
        """Start ``simple_switch_grpc`` in the node's namespace on its server, detached, by the
        server's agent (no ssh session per switch): its pid in :attr:`pid_file`, its output in
        :attr:`out_file` there. Returns at once (:meth:`wait_ready` waits). Raises
        EmulationError when the server refuses."""
        sock = self.listen_addr[len("unix:"):]
        inner = (f"echo $$ > {shlex.quote(self.pid_file)}; "
                 f"exec {kernel.command_line(kernel.netns_exec_argv(self.netns, self.command()))}")
        script = (f"rm -f {shlex.quote(sock)}; setsid sh -c {shlex.quote(inner)} "
                  f">>{shlex.quote(self.out_file)} 2>&1 </dev/null &")
        if self.thrift_port is not None and not self.forwarded:  # once: it outlives a restarted switch
            helper = kernel.netns_exec_argv(self.netns, ["python3", "-c", SWITCH_HELPER, self._remote("thrift"),
                                                         str(self.thrift_port), self._remote("ctl")])
            script += (f" rm -f {shlex.quote(self._remote('thrift'))} {shlex.quote(self._remote('ctl'))};"
                       f" setsid {kernel.command_line(helper)} >>{shlex.quote(self.out_file)} 2>&1 </dev/null &")
        r = self.on_server.run(["sh", "-c", script])
        if r.returncode != 0:
            raise EmulationError(f"{self.name} on {self.mrclab_server.name}: cannot start {BMV2_BINARY}: "
                                 f"{r.stderr.strip()}")
        self.proc = None  # no process here: the switch is the server's

    def _remote(self, kind: str) -> str:
        """The switch helper's ``kind`` socket on the server (``thrift`` or ``ctl``)."""
        return f"{self.remote_dir}/{self.name}.{kind}"

    @property
    def thrift_addr(self) -> str | None:
        """The unix socket here that reaches the switch's Thrift runtime on its server (None without
        one)."""
        return None if self.thrift_port is None else str(self.run_dir / f"{self.name}.thrift")

    @property
    def control_addr(self) -> str | None:
        """The unix socket here that reaches the switch helper's asks (None without Thrift)."""
        return None if self.thrift_port is None else str(self.run_dir / f"{self.name}.ctl")

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until the switch's socket exists on its server, then forward it here. Raises
        EmulationError if the switch (or its ssh) exited, or the forward is refused."""
        sock = self.listen_addr[len("unix:"):]
        pid, out = shlex.quote(self.pid_file), shlex.quote(self.out_file)
        # 0: listening; 1: not yet; 2: the process is gone (its last words follow)
        probe = (f"[ -S {shlex.quote(sock)} ] && exit 0; [ -f {pid} ] && ! kill -0 $(cat {pid}) 2>/dev/null "
                 f"&& {{ tail -c 600 {out}; exit 2; }}; exit 1")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.on_server.run(["sh", "-c", probe])
            if r.returncode == 0:
                break
            if r.returncode == 2:
                raise EmulationError(f"{self.name} on {self.mrclab_server.name}: {BMV2_BINARY} exited: "
                                     f"{r.stdout.strip()}")
            time.sleep(0.05)
        else:
            raise EmulationError(f"{self.name} on {self.mrclab_server.name}: {BMV2_BINARY} did not open {sock} "
                                 f"within {timeout_s} s")
        if not self.forwarded:
            pairs = [("P4Runtime", self.grpc_addr[len("unix:"):], sock)]
            if self.thrift_addr is not None and self.control_addr is not None:
                pairs += [("Thrift", self.thrift_addr, self._remote("thrift")),
                          ("control", self.control_addr, self._remote("ctl"))]
            for what, local, remote in pairs:
                Path(local).unlink(missing_ok=True)
                why = self.ssh_session.forward(self.mrclab_server, local, remote)
                if why is not None:
                    raise EmulationError(f"{self.name}: cannot forward its {what} socket from "
                                         f"{self.mrclab_server.name}: {why}")
            self.forwarded = True

    def kill(self) -> None:
        """Kill the switch process on its server (a crashed switch); the namespace and links stay."""
        pid = shlex.quote(self.pid_file)
        self.on_server.run(["sh", "-c", f"[ -f {pid} ] && kill -9 $(cat {pid}); rm -f {pid}; true"])
        self.proc = None

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's name
        """Kill the switch process, then Mininet's stop."""
        self.kill()
        Switch.stop(self, deleteIntfs)

    def alive(self) -> bool:
        """Whether the switch process still runs on its server."""
        pid = shlex.quote(self.pid_file)
        return self.on_server.run(["sh", "-c", f"kill -0 $(cat {pid})"]).returncode == 0


class PreMadeLink(Link):
    """A Mininet link whose two interfaces were made beforehand (:func:`vxlan_lines`, in one batch
    per server): Mininet only records them."""

    def makeIntfPair(self, *args, **kwargs) -> None:  # noqa: N802 - Mininet's name
        """Nothing to make: the interfaces are in their nodes already."""
        return None


def vxlan_lines(name: str, mac: str, vni: int, remote_ip: str, pid: int) -> list[str]:
    """``ip -batch`` lines that make VXLAN port ``name`` (MAC ``mac``, VNI ``vni``) towards
    ``remote_ip``, in process ``pid``'s namespace at once, its UDP socket in the underlay
    namespace the batch runs in (the kernel keeps the requester's namespace as the tunnel's). Made
    in place, not moved: each move waits for an RCU grace period, and 64 of them were 2.5 s."""
    return [f"link add {name} address {mac} netns {pid} type vxlan id {vni} remote {remote_ip} "
            f"dstport {VXLAN_PORT}"]


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
