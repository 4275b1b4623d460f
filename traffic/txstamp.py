"""NIC departure stamps: when a host NIC port actually sent each frame, as hardware stamps it.

A NIC stamps a packet when its port puts it on the wire, and the paper's transport times RTT
samples and the retransmission timer from there. An emulated host's port is a token bucket filter
(the ``tbf`` of emulation/network.py) in front of a veth; the kernel stamps a frame when the qdisc
hands it to the veth (``skb_tx_timestamp`` in ``veth_xmit``): after its wait in the port's queue,
including any time the machine held that queue. The endpoint asks for those stamps
(``SO_TIMESTAMPING`` with ``SOF_TIMESTAMPING_TX_SOFTWARE``, Documentation/networking/timestamping.rst)
on a send-only socket per port, so that a stamp never wakes the loop (a socket with stamps queued
reads as POLLERR, which poll(2) reports whatever it was asked): it drains them once a turn. Each
stamp comes back with the frame's first bytes, enough for the transport headers that say whose
packet it was (:meth:`traffic.wire.Wire.sent_data`).

The host's model of its port queues (traffic/nicqueue.py) predicts the same wait from what it sent
before; the machine can hold a port longer than the model says (a flap-soak trace on a busy
machine: a packet left its port 72 ms after it was handed over, 39 ms after the model's departure,
and its timer fired 18 ms after it left, 2026-12-06). The stamp is what the port did.
"""

from __future__ import annotations

import socket
import struct

#: linux <asm-generic/socket.h>, <linux/net_tstamp.h>
SO_TIMESTAMPING = 37
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33
#: Buffer for a stamped frame's bytes: they come back whole unless asked for fewer; the transport
#: headers of a data packet end inside this (150 bytes), behind a VXLAN tunnel's 50 too.
HEAD_BYTES = 256
#: Room for the control messages of one stamp: SCM_TIMESTAMPING's three timespecs and the
#: sock_extended_err that says what was stamped.
ANC_BYTES = 128
#: Stamps read at most per port and turn (the rest wait for the next turn).
MAX_PER_DRAIN = 512
_TS = struct.Struct("qq")


def open_stamped(ifname: str, buf_bytes: int = 8 << 20) -> socket.socket:
    """A non-blocking raw AF_PACKET socket bound to ``ifname`` that sends and never receives
    (protocol 0), each frame it sends stamped when the port sends it (software TX stamps).
    Raises OSError where the kernel refuses the stamps (the caller then goes without)."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        for opt in (SO_RCVBUFFORCE, SO_SNDBUFFORCE):  # the stamps queue against the receive buffer
            try:
                s.setsockopt(socket.SOL_SOCKET, opt, buf_bytes)
            except OSError:
                pass
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE)
        s.bind((ifname, 0))
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


def drain(sock: socket.socket, out: list[tuple[bytes, float]], limit: int = MAX_PER_DRAIN) -> int:
    """Append ``(the frame's first HEAD_BYTES bytes, when its port sent it)`` for each stamp queued
    on ``sock`` (time.time()'s clock, s), at most ``limit``; returns how many were read."""
    n = 0
    recv = sock.recvmsg
    flag = socket.MSG_ERRQUEUE
    level = socket.SOL_SOCKET
    while n < limit:
        try:
            head, anc, _flags, _addr = recv(HEAD_BYTES, ANC_BYTES, flag)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:  # the port is gone (its namespace is being torn down)
            break
        for lvl, typ, data in anc:
            if lvl == level and typ == SO_TIMESTAMPING:
                sec, ns = _TS.unpack_from(data, 0)
                out.append((head, sec + ns * 1e-9))
                break
        n += 1
    return n
