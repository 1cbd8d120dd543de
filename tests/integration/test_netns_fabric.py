"""Hosts as network namespaces (dualpath/netns/): links that the kernel shapes, faults, teardown.

Real namespaces, veths, a bridge, tc and nft (root; skipped with the reason otherwise):
the fabric's hosts reach each other and are reached from here; a cut link passes nothing
until restored; a delayed link delays; closing a fabric, or reaping one whose creator was
killed with SIGKILL, leaves no namespace and no process behind.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from dualpath.netns.fabric import Fabric, leftovers, namespaces, probe, reap_orphans, run
from dualpath.netns.links import Links
from dualpath.netns.nsenter import entered

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(probe() is not None, reason=f"network namespaces: {probe()}")]


class Echo:
    """A tcp echo server inside host `host`: answers each byte with one byte."""

    def __init__(self, host) -> None:
        with entered(host.ns):
            self.sock = socket.create_server((host.ip, 0))
        self.addr = (host.ip, self.sock.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(c,), daemon=True).start()

    @staticmethod
    def _echo(c: socket.socket) -> None:
        with c:
            while data := c.recv(65536):
                c.sendall(data[:1])

    def close(self) -> None:
        self.sock.close()


def round_trip(host, addr, timeout: float = 5.0) -> float:
    """Seconds of one connect-free round trip from inside `host` (raises OSError if cut)."""
    with entered(host.ns):
        s = socket.create_connection(addr, timeout=timeout)
    with s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = time.perf_counter()
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        return time.perf_counter() - t


def test_hosts_reach_each_other_and_are_reached_from_here_and_close_leaves_nothing():
    with Fabric() as f:
        a, b = f.add_host("a"), f.add_host("b")
        echo = Echo(b)
        round_trip(a, echo.addr)
        with socket.create_connection(echo.addr, timeout=5):  # from this namespace, over the uplink
            pass
        assert a.ip != b.ip and {a.ns, b.ns, f.sw} <= set(namespaces())
        echo.close()
    assert not leftovers(os.getpid())
    assert f.uplink not in run(["ip", "-o", "link", "show"]).stdout


def test_links_are_shaped_by_the_kernel_and_faults_come_and_go():
    with Fabric() as f:
        a, b = f.add_host("a"), f.add_host("b")
        links = Links(f)
        links.shape(a, gbps=2.0, delay_ms=30)
        assert "tbf" in run(["ip", "netns", "exec", a.ns, "tc", "qdisc", "show", "dev", "eth0"]).stdout
        assert "rate 2Gbit" in run(["ip", "netns", "exec", f.sw, "tc", "qdisc", "show", "dev", a.port]).stdout
        echo = Echo(b)
        assert round_trip(a, echo.addr) >= 0.030  # every packet a sends waits 30 ms in the kernel
        links.set_delay(a, 0)
        links.cut(a)
        with pytest.raises(OSError):
            round_trip(a, echo.addr, timeout=1.0)
        round_trip(b, (b.ip, echo.addr[1]))  # b itself is fine
        links.restore(a)
        round_trip(a, echo.addr)
        links.set_loss(a, 100)
        with pytest.raises(OSError):
            round_trip(a, echo.addr, timeout=1.0)
        links.clear(a)
        round_trip(a, echo.addr)
        echo.close()


CRASHER = """
import sys, time
from dualpath.netns.fabric import Fabric
f = Fabric()
h = f.add_host("x")
import subprocess
subprocess.Popen(["ip", "netns", "exec", h.ns, "sleep", "600"], start_new_session=True)
print(f.sw, h.ns, flush=True)
time.sleep(600)
"""


def test_a_fabric_whose_creator_was_killed_is_reaped_with_what_ran_inside():
    p = subprocess.Popen([sys.executable, "-c", CRASHER], stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    sw, ns = p.stdout.readline().split()
    sleeper = run(["ip", "netns", "pids", ns]).stdout.split()
    assert sleeper and {sw, ns} <= set(namespaces())
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert {sw, ns} <= set(namespaces())  # a crash leaves them ...
    assert set(reap_orphans()) >= {sw, ns}  # ... until the next fabric (or mesh stop) reaps them
    assert not {sw, ns} & set(namespaces())
    p.stdout.close()
    # killed with its namespace (a zombie until its parent, gone too, is reaped); a SIGKILL lands
    # asynchronously, so wait for it to have (a hang here is the suite's timeout, a failure)
    while not all(map(dead, sleeper)):
        time.sleep(0.01)


def dead(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
