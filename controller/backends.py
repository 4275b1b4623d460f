"""How each data plane realises the fault holds of :mod:`controller.faults`: the
:class:`~controller.faults.FaultBackend` of a running :class:`~controller.fabric.Fabric`, one class
per data plane. The injector decides what must change; these say how. Each holds the running
fabric (``fab``, a :class:`~controller.fabric.Fabric`: its emulation, plan, routes and switch
sessions), which imports this module, so the type is named here, not imported.
"""

from __future__ import annotations

from mrclab.controller import kernel_routes
from mrclab.emulation.nodes import Bmv2Switch
from mrclab.topologies.spec import is_host


class LinuxFaults:
    """How the linux data plane realises faults (controller/faults.py): interfaces up and down,
    a policy rule for a blackhole. The kernel flushes the routes of a port set down, and a switch's
    static routes are configuration that outlives a link flap, so an interface brought up gets its
    switch's entries again (a diff)."""

    fresh_on_restart = False
    switch_ports_follow = True

    def __init__(self, fab) -> None:
        """The linux backend of running fabric ``fab``."""
        self.fab = fab
        self.reroute: set[str] = set()

    def set_iface(self, node: str, peer: str, up: bool) -> None:
        """Set ``node``'s interface facing ``peer`` up or down; a switch with an interface brought
        up gets its routes again at :meth:`settle`."""
        self.fab.emu.set_iface(node, peer, up)
        if up and not is_host(node):
            self.reroute.add(node)

    def settle(self, now) -> None:
        """Give every switch with an interface brought up its routes out of the ports now up."""
        plan = self.fab.plan
        for sw in sorted(self.reroute):
            up = {port for port, peer in plan.ports(sw).items() if now.iface_up[(sw, peer)]}
            kernel_routes.apply(self.fab.netns(sw), self.fab.routes[sw], self.fab.routes.block, ports_up=up)
        self.reroute.clear()

    def set_drop(self, switch: str, peer: str, rate: float) -> None:
        """Gray loss: ``switch`` drops ``rate`` (0..1) of what it sends to ``peer``, by configuring
        that port's tc eBPF program again."""
        fab = self.fab
        port = fab.plan.port_to(switch, peer)
        fab.port_loss_now[(switch, port)] = rate
        fab.bpf[switch].configure(f"{switch}-eth{port}", fab.port_config(switch, port))

    def set_alive(self, switch: str, alive: bool) -> None:
        """Nothing to do: a dead linux switch is its interfaces down, which
        :func:`~controller.faults.desired` already says."""

    def set_blackhole(self, switch: str, on: bool) -> None:
        """Add (``on``) or remove the policy rule that blackholes every IPv6 lookup of ``switch``."""
        kernel_routes.set_blackhole(self.fab.netns(switch), on)


class Bmv2Faults:
    """How the bmv2 data plane realises faults: host interfaces, per-port drop entries, the
    blackhole (the fault mode in ``my_sid``), and killing / restarting the switch process."""

    fresh_on_restart = True
    switch_ports_follow = False

    def __init__(self, fab) -> None:
        """The bmv2 backend of running fabric ``fab``."""
        self.fab = fab

    def set_iface(self, node: str, peer: str, up: bool) -> None:
        """Set ``node``'s interface facing ``peer`` up or down (on bmv2 only hosts' ends are asked)."""
        self.fab.emu.set_iface(node, peer, up)

    def set_drop(self, switch: str, peer: str, rate: float) -> None:
        """``switch`` drops ``rate`` (0..1) of what it sends to ``peer``: a ``port_fault`` entry (0
        removes it)."""
        self.fab.p4[switch].set_port_loss(self.fab.plan.port_to(switch, peer), rate, self.fab.loss_salt)

    def set_alive(self, switch: str, alive: bool) -> None:
        """Restart the switch process and give it its pipeline and entries again, or close its
        P4Runtime session and kill it."""
        if alive:
            self.fab.emu.restart_switch(switch)
            self.fab.reprogram(switch)
        else:
            self.fab.p4[switch].close()
            node = self.fab.emu.node(switch)
            assert isinstance(node, Bmv2Switch)
            node.kill()

    def set_blackhole(self, switch: str, on: bool) -> None:
        """Set or clear the blackhole mode of ``switch`` (its ``my_sid`` entry and default action)."""
        self.fab.p4[switch].set_blackhole(on)

    def settle(self, now) -> None:
        """Nothing to do: on bmv2 every change took effect as it was made."""
        pass
