"""Hosts on one machine: network namespaces joined by veth links to a bridge, made and torn down.

Owns one emulated network's namespaces, links and addresses (`Fabric`), `probe` and `reap_orphans`;
shaping and faults are links.py's. Names start with `dpn-<pid>-`; subnets never leave the switch.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from dualpath.netns.nsenter import NETNS_DIR
from shared.transport.shm_region import process_alive

PREFIX = "dpn-"
NET = ipaddress.ip_network("198.18.0.0/16")  # /24 per fabric: 198.18.<k>.0/24
LOCK = "/run/dualpath-netns.lock"
_NAME = re.compile(r"^dpn-(\d+)-")
_count = 0  # fabrics this process made


class FabricError(RuntimeError):
    """A namespace, link or address could not be made: `cmd` is the command, `detail` its stderr."""

    def __init__(self, cmd: list[str], detail: str):
        super().__init__(f"{' '.join(cmd)}: {detail.strip()}")
        self.cmd, self.detail = cmd, detail


def run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise FabricError(cmd, p.stderr or p.stdout)
    return p


def probe() -> str | None:
    """None when namespaces, veths and a bridge can be made here; else why not (for skips)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "nft", "iptables-legacy"):  # iptables-legacy: the NFQUEUE rule of added latency
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install iproute2 nftables iptables)"
    name = f"{PREFIX}{os.getpid()}-probe"
    try:
        run(["ip", "netns", "add", name])
        run(["ip", "-n", name, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", name, "link", "add", "name", "dpa", "type", "veth", "peer", "name", "dpb"])
    except (FabricError, OSError) as exc:
        return f"cannot make a namespace with a bridge and a veth: {exc}"
    finally:
        run(["ip", "netns", "del", name], check=False)
    return None


@dataclass
class Host:
    """One host of a fabric: its namespace, its address, and its port on the switch."""

    name: str
    ns: str
    ip: str
    port: str  # the switch-side end of its link ("p<i>")
    extras: list[subprocess.Popen] = field(default_factory=list)  # helpers running in it (delayers)


def namespaces() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []


def delete_namespace(ns: str) -> None:
    """Kill what runs inside `ns`, then delete it (its veths go with it)."""
    pids = run(["ip", "netns", "pids", ns], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    run(["ip", "netns", "del", ns], check=False)


def reap_orphans() -> list[str]:
    """Delete the fabric namespaces whose creating process is gone (it crashed or was killed)."""
    reaped = []
    for ns in namespaces():
        m = _NAME.match(ns)
        if m and not process_alive(int(m.group(1))):
            delete_namespace(ns)
            reaped.append(ns)
    return reaped


def leftovers(pid: int | None = None) -> list[str]:
    """Fabric namespaces still present (of `pid` only, when given)."""
    return [ns for ns in namespaces() if ns.startswith(PREFIX) and (pid is None or ns.startswith(f"{PREFIX}{pid}-"))]


class Fabric:
    """One emulated network: `add_host` as many times as needed, then `close()`."""

    def __init__(self) -> None:
        global _count
        reap_orphans()
        self.tag = f"{PREFIX}{os.getpid()}-{_count}"
        self.uplink = f"dpn{os.getpid()}k{_count}"[:15]
        _count += 1
        self.sw = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self.closed = False
        try:
            with open(LOCK, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.subnet = self._free_subnet()
                self._make_switch()
        except BaseException:
            self.close()
            raise

    @property
    def gateway_ip(self) -> str:
        """This namespace's address on the fabric (where tests and `dualpath up` reach hosts from)."""
        return str(self.subnet[254])

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = run(["ip", "-4", "-o", "addr", "show"]).stdout
        for sub in list(NET.subnets(new_prefix=24))[1:255]:
            if f" {sub[254]}/" not in used:
                return sub
        raise FabricError(["ip", "addr"], "every 198.18.<k>.0/24 is in use")

    def _make_switch(self) -> None:
        run(["ip", "netns", "add", self.sw])
        run(["ip", "-n", self.sw, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", self.sw, "link", "set", "br0", "up"])
        run(["ip", "link", "add", self.uplink, "type", "veth", "peer", "name", "p0", "netns", self.sw])
        run(["ip", "-n", self.sw, "link", "set", "p0", "master", "br0", "up"])
        run(["ip", "addr", "add", f"{self.gateway_ip}/24", "dev", self.uplink])
        run(["ip", "link", "set", self.uplink, "up"])

    def add_host(self, name: str) -> Host:
        """A new namespace `<tag>-<name>` linked to the switch, with the next free address."""
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists already")
        i = len(self.hosts) + 1
        if i >= 254:
            raise FabricError(["add_host", name], "a fabric holds at most 253 hosts")
        host = Host(name, f"{self.tag}-{name}", str(self.subnet[i]), f"p{i}")
        self.hosts[name] = host
        run(["ip", "netns", "add", host.ns])
        run(["ip", "link", "add", "eth0", "netns", host.ns, "type", "veth", "peer", "name", host.port,
             "netns", self.sw])
        run(["ip", "-n", self.sw, "link", "set", host.port, "master", "br0", "up"])
        run(["ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0"])
        run(["ip", "-n", host.ns, "link", "set", "eth0", "up"])
        run(["ip", "-n", host.ns, "link", "set", "lo", "up"])
        return host

    def close(self) -> None:
        """Stop helpers, delete every namespace of this fabric (links and uplink go with them)."""
        if self.closed:
            return
        self.closed = True
        for host in self.hosts.values():
            for p in host.extras:
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(5)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
        for ns in [*(h.ns for h in self.hosts.values()), self.sw]:
            delete_namespace(ns)
        run(["ip", "link", "del", self.uplink], check=False)

    def __enter__(self) -> "Fabric":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
