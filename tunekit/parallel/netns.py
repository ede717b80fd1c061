"""Emulated nodes on one machine: one network namespace per node, joined by a slow link. Engine.

    >>> with EmulatedNodes(2, bandwidth="50mbit", latency="1ms") as nodes:
    ...     cmd = nodes.exec_prefix(1) + [sys.executable, "worker.py"]   # runs "on node 1"
    ...     env = {"GLOO_SOCKET_IFNAME": nodes.ifname, "MASTER_ADDR": nodes.addresses[0]}

Each node is a namespace ``tk-<pid>-<k>n<i>`` with its loopback and one interface ``tk0``
(a TUN device) holding the node's address in a private /24 that lives only inside these
namespaces. Traffic between ranks of one node stays on that node's loopback; traffic between
nodes leaves through ``tk0``, where the kernel's ``tc tbf`` shapes it to ``bandwidth`` (each
node's outgoing link), and reaches the other node through a small relay process that holds
every ``tk0``: it adds ``latency`` (one way, so a round trip between nodes takes 2 x latency)
and paces what each node receives at ``bandwidth`` (a switch port's rate towards that node).
The delay lives in the relay rather than in ``tc netem`` because sch_netem is often not
built (it is missing on the kernel these tests run on); tbf and TUN are everywhere.

Needs root, iproute2 (``ip``, ``tc``), network namespaces, TUN and sch_tbf: ``check()`` says
which is missing. The relay is Python: on the 2-core test machine it used ~5% of a core at
50 Mbit/s and carried at most ~1.2 Gbit/s, so faster links are slower than asked (measure
them). On exit, after an error in the block and on Ctrl-C, the relay is stopped and every
namespace is deleted (with it every link, address and qdisc the run made); nothing is ever
added to the host's own namespace. Leftovers of a run that was killed (its pid is gone)
are swept when the next one starts.
"""
from __future__ import annotations

import ctypes
import heapq
import ipaddress
import itertools
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import time

from tunekit.core.validate import whole
from tunekit.measure.interrupts import deferred_interrupt

IFNAME = "tk0"
MTU = 9000                    # jumbo frames, as on cluster links: fewer packets for the relay
PREFIX = f"tk-{os.getpid()}-"
_NAME = re.compile(r"^tk-(\d+)-")
_RUNS = itertools.count()
_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_CLONE_NEWNET = 0x40000000
_TUNSETIFF, _IFF_TUN, _IFF_NO_PI = 0x400454CA, 0x0001, 0x1000


def parse_bandwidth(text) -> float:
    """``"50mbit"`` -> 5e7 bits per second (SI prefixes, as tc reads them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", str(text).lower())
    if not m or m.group(2) not in _BITS:
        raise ValueError(f"bandwidth must be a number with a unit in {list(_BITS)} (e.g. '50mbit', "
                         f"'1gbit'), got {text!r}; tc reads 'mbps' as megaBYTES/s, so write mbit")
    bits = float(m.group(1)) * _BITS[m.group(2)]
    if not 8e3 <= bits <= 1e11:
        raise ValueError(f"bandwidth must be between 8kbit and 100gbit, got {text!r}")
    return bits


def parse_latency(text) -> float:
    """``"1ms"`` -> 0.001 s, one way; ``"0"`` adds no delay."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s)?\s*", str(text).lower())
    if not m or (m.group(2) is None and float(m.group(1)) != 0):
        raise ValueError(f"latency must be a number with a unit in {list(_SECONDS)} (e.g. '1ms', "
                         f"'250us'), or 0, got {text!r}")
    seconds = float(m.group(1)) * _SECONDS[m.group(2) or "s"]
    if seconds > 10:
        raise ValueError(f"latency must be at most 10 s (one way), got {text!r}")
    return seconds


def _run(*cmd, check=True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and out.returncode:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out


_CHECKED: list = []


def check() -> str | None:
    """None when emulated nodes can run here, else the reason (once per process)."""
    if not _CHECKED:
        _CHECKED.append(_check())
    return _CHECKED[0]


def _check() -> str | None:
    if sys.platform != "linux":
        return "emulated nodes need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated nodes need root (network namespaces and tc); run as root or skip them"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"emulated nodes need iproute2: {' and '.join(missing)} not found"
    if not os.path.exists("/dev/net/tun"):
        return "emulated nodes need TUN devices: /dev/net/tun is missing"
    probe = f"{PREFIX}check"
    steps = [("network namespaces", ["ip", "netns", "add", probe]),
             ("TUN devices", ["ip", "-n", probe, "tuntap", "add", "dev", IFNAME, "mode", "tun"]),
             ("sch_tbf (tc's token bucket)", ["tc", "-n", probe, "qdisc", "add", "dev", IFNAME, "root",
                                              "tbf", "rate", "1mbit", "burst", "20000", "limit", "100000"])]
    try:
        for what, cmd in steps:
            out = _run(*cmd, check=False)
            if out.returncode:
                return f"emulated nodes need {what}: `{' '.join(cmd)}` said {out.stderr.strip()!r}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Delete namespaces left by runs whose process is gone; returns their names."""
    out = _run("ip", "netns", "list", check=False)
    gone = []
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _run("ip", "netns", "del", name, check=False)
            gone.append(name)
    return gone


def _host_networks() -> list:
    """Every IPv4 network the host has an address in or a route to."""
    nets = []
    for cmd in (["ip", "-4", "-o", "addr"], ["ip", "-4", "route", "show", "table", "all"]):
        for word in _run(*cmd, check=False).stdout.split():
            try:
                nets.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    return [n for n in nets if n.prefixlen > 0]   # the default route overlaps everything


def free_subnet(taken=None) -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that overlaps none of the host's addresses and routes."""
    taken = _host_networks() if taken is None else taken
    for third in range(200, 256):
        for second in range(77, 256):
            net = ipaddress.ip_network(f"10.{second}.{third}.0/24")
            if not any(net.overlaps(t) for t in taken):
                return net
    raise RuntimeError("no free /24 in 10.77-255.200-255.0/24 for the emulated nodes")


class EmulatedNodes:
    """``nodes`` network namespaces joined by a ``bandwidth`` / ``latency`` link; see the module."""

    def __init__(self, nodes: int, bandwidth: str | None = "50mbit", latency: str | None = "1ms"):
        self.nodes = whole("nodes", nodes, minimum=2, maximum=250)
        bandwidth = "50mbit" if bandwidth is None else bandwidth   # None: the default
        latency = "1ms" if latency is None else latency
        self.bandwidth, self.latency = str(bandwidth), str(latency)
        self.rate_bits = parse_bandwidth(bandwidth)
        self.delay_s = parse_latency(latency)
        run = f"{PREFIX}{next(_RUNS)}"
        self.names = [f"{run}n{i}" for i in range(self.nodes)]
        self.ifname = IFNAME
        self.addresses: list[str] = []
        self.subnet = None
        self._relay = None
        self._made: list[str] = []

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program inside node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.names[whole("node", i, 0, self.nodes - 1)]]

    def __enter__(self) -> "EmulatedNodes":
        why = check()
        if why:
            raise RuntimeError(why)
        sweep()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup(self) -> None:
        self.subnet = free_subnet()
        hosts = list(self.subnet.hosts())
        self.addresses = [str(hosts[i]) for i in range(self.nodes)]
        for name in self.names:
            _run("ip", "netns", "add", name)
            self._made.append(name)
        # the relay opens every node's tk0 from inside that node's namespace; it lives until its
        # stdin closes (our exit, or this process dying), and the devices vanish with it
        spec = ",".join(f"{n}={a}" for n, a in zip(self.names, self.addresses))
        # -I: the relay sees neither PYTHONPATH nor the current folder (nothing can shadow the
        # stdlib); it needs only tunekit, found through the folder that holds this package
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (f"import sys; sys.path.insert(0, {root!r}); from tunekit.parallel.netns import relay; "
                f"relay({spec!r}, {self.rate_bits!r}, {self.delay_s!r})")
        self._relay = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        ready, _, _ = select.select([self._relay.stdout], [], [], 30)
        line = self._relay.stdout.readline().strip() if ready else b""
        if line != b"ready":
            self._relay.kill()
            err = self._relay.communicate()[1].decode(errors="replace").strip()
            raise RuntimeError(f"the link relay did not start: {err.splitlines()[-1] if err else 'no answer in 30 s'}")
        burst = max(2 * MTU, int(self.rate_bits / 8 * 1e-3))     # >= 2 frames, or 1 ms of traffic
        limit = max(4 * burst, int(self.rate_bits / 8 * 0.05))   # 50 ms of queue before tail drop
        for name, addr in zip(self.names, self.addresses):
            _run("ip", "-n", name, "link", "set", "lo", "up")
            _run("ip", "-n", name, "link", "set", IFNAME, "mtu", str(MTU))
            _run("ip", "-n", name, "addr", "add", f"{addr}/{self.subnet.prefixlen}", "dev", IFNAME)
            _run("ip", "-n", name, "link", "set", IFNAME, "up")
            _run("tc", "-n", name, "qdisc", "add", "dev", IFNAME, "root", "tbf",
                 "rate", f"{int(self.rate_bits)}bit", "burst", str(burst), "limit", str(limit))

    def close(self) -> None:
        """Stop the relay and delete every namespace this run made (idempotent). A Ctrl-C that
        comes meanwhile waits until everything is gone."""
        with deferred_interrupt():
            relay, self._relay = self._relay, None
            if relay is not None:
                relay.stdin.close()
                try:
                    relay.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    relay.kill()
                    relay.wait()
                relay.stdout.close()
                relay.stderr.close()
            while self._made:
                _run("ip", "netns", "del", self._made[-1], check=False)
                self._made.pop()

    def __repr__(self) -> str:
        return (f"EmulatedNodes({self.nodes}, bandwidth={self.bandwidth!r}, latency={self.latency!r}; "
                f"addresses={self.addresses})")


# --- the relay: a separate process started by EmulatedNodes ---------------------------------------


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


def _open_tun(namespace: str) -> int:
    """A TUN device named tk0 created inside ``namespace``; returns its file descriptor."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        _setns(f"/var/run/netns/{namespace}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        import fcntl

        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", IFNAME.encode(), _IFF_TUN | _IFF_NO_PI))
        return fd
    finally:
        if ctypes.CDLL(None, use_errno=True).setns(home, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the host namespace")
        os.close(home)


def deliver_at(now: float, free_at: dict, dst, nbytes: int, rate_bits: float, delay_s: float) -> float:
    """When the relay hands on a packet of ``nbytes`` that reached it at ``now``, bound for
    ``dst``: ``delay_s`` later, and not before the port towards ``dst`` has sent what is queued
    ahead of it at ``rate_bits`` (``free_at[dst]`` moves on by this packet's time on the wire).
    Pure: the clock is the caller's."""
    at = max(now + delay_s, free_at[dst])
    free_at[dst] = at + 8 * nbytes / rate_bits
    return at


def relay(spec: str, rate_bits: float, delay_s: float) -> None:
    """Move IPv4 packets between the nodes' tk0 devices, each ``delay_s`` late, and at most
    ``rate_bits`` per second into each node. Returns when stdin closes."""
    nodes = [item.split("=") for item in spec.split(",")]
    fds = [_open_tun(name) for name, _ in nodes]
    by_addr = {socket.inet_aton(addr): fd for (_, addr), fd in zip(nodes, fds)}
    free_at = dict.fromkeys(fds, 0.0)   # when the port towards each node is free again
    due: list = []                      # heap of (deliver_at, seq, fd, packet)
    seq = itertools.count()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stdin = sys.stdin.fileno()
    while True:
        wait = max(0.0, due[0][0] - time.monotonic()) if due else None
        readable, _, _ = select.select(fds + [stdin], [], [], wait)
        if stdin in readable and not os.read(stdin, 4096):
            return
        now = time.monotonic()
        for fd in readable:
            if fd == stdin:
                continue
            while True:
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                dst = by_addr.get(pkt[16:20]) if len(pkt) >= 20 and pkt[0] >> 4 == 4 else None
                if dst is None:
                    continue   # IPv6 chatter, broadcast: no other node wants it
                heapq.heappush(due, (deliver_at(now, free_at, dst, len(pkt), rate_bits, delay_s), next(seq), dst, pkt))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, fd, pkt = heapq.heappop(due)
            try:
                os.write(fd, pkt)
            except OSError:
                pass   # the node's device is going away (shutdown): drop, like a cable pulled

