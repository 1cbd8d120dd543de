"""What a fabric's links do to packets: a kernel rate limit, a delay, loss, a cut.

Owns the `tc`, `nft` and `iptables` state of one fabric's links (`Links`); the switch's rules are
rewritten whole from `self.state` on each change.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from dualpath.netns.fabric import Fabric, Host, run
from dualpath.netns.nsenter import exec_argv

QUEUE = 0  # NFQUEUE number (queues are per namespace)


@dataclass
class LinkState:
    gbps: float = 0.0  # 0 = unlimited
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    cut: bool = False


def _tbf(dev: str, gbps: float) -> list[str]:
    rate = int(gbps * 1e9)
    burst = max(256 << 10, rate // 8 // 100)  # >= 10 ms of the rate and >= a GSO packet
    return ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate}bit", "burst", str(burst),
            "latency", "100ms"]


class Links:
    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.state: dict[str, LinkState] = {}
        self._delayers: dict[str, subprocess.Popen] = {}

    def _of(self, host: Host) -> LinkState:
        return self.state.setdefault(host.name, LinkState())

    # rate and delay (the host's own namespace) ----------------------------------------
    def shape(self, host: Host, gbps: float = 0.0, delay_ms: float = 0.0) -> None:
        """Rate-limit the host's link both ways to `gbps` (0: no limit) and delay what it sends."""
        st = self._of(host)
        st.gbps = gbps
        if gbps > 0:
            run(["ip", "netns", "exec", host.ns, *_tbf("eth0", gbps)])
            run(["ip", "netns", "exec", self.fabric.sw, *_tbf(host.port, gbps)])
        else:
            run(["ip", "netns", "exec", host.ns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
            run(["ip", "netns", "exec", self.fabric.sw, "tc", "qdisc", "del", "dev", host.port, "root"], check=False)
        self.set_delay(host, delay_ms)

    def set_delay(self, host: Host, delay_ms: float) -> None:
        st = self._of(host)
        old = self._delayers.pop(host.name, None)
        if old is not None:  # one listener per queue: the old goes first (meanwhile packets pass undelayed)
            old.terminate()
            old.wait(5)
        rule = ["-o", "eth0", "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass"]
        ipt = ["ip", "netns", "exec", host.ns, "iptables-legacy", "-t", "mangle"]
        if delay_ms > 0:
            new = subprocess.Popen(exec_argv(host.ns, [sys.executable, "-m", "dualpath.netns.delay", "--queue",
                                                      str(QUEUE), "--ms", str(delay_ms)]),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            line = new.stdout.readline()
            if not line.startswith("delaying"):
                new.kill()
                rest = new.stdout.read()
                new.stdout.close()
                new.wait()
                raise RuntimeError(f"delay helper for {host.name} did not start: {line}{rest}")
            new.stdout.close()  # it prints nothing more
            self._delayers[host.name] = new
            host.extras.append(new)
            if not st.delay_ms:
                run([*ipt, "-A", "POSTROUTING", *rule])
        elif st.delay_ms:
            run([*ipt, "-D", "POSTROUTING", *rule], check=False)
        st.delay_ms = delay_ms

    # loss and cuts (the switch) -----------------------------------------------------------
    def cut(self, host: Host) -> None:
        self._of(host).cut = True
        self._apply()

    def restore(self, host: Host) -> None:
        self._of(host).cut = False
        self._apply()

    def set_loss(self, host: Host, pct: float) -> None:
        if not 0 <= pct <= 100:
            raise ValueError(f"loss {pct}% is not a percentage")
        self._of(host).loss_pct = pct
        self._apply()

    def clear(self, host: Host) -> None:
        """No loss, no cut, no delay (the rate limit stays)."""
        st = self._of(host)
        st.loss_pct, st.cut = 0.0, False
        self.set_delay(host, 0)
        self._apply()

    def _apply(self) -> None:
        rules = []
        for name, st in self.state.items():
            port = self.fabric.hosts[name].port
            if st.cut or st.loss_pct >= 100:
                rules += [f'iifname "{port}" drop', f'oifname "{port}" drop']
            elif st.loss_pct > 0:
                n = int(round(st.loss_pct * 100))  # per 10,000
                rules += [f'iifname "{port}" numgen random mod 10000 < {n} drop',
                          f'oifname "{port}" numgen random mod 10000 < {n} drop']
        body = "\n".join(f"    {r}" for r in rules)
        script = ("table bridge dpfault\ndelete table bridge dpfault\n"
                  "table bridge dpfault {\n  chain faults {\n    type filter hook forward priority 0; policy accept;\n"
                  f"{body}\n  }}\n}}\n")
        p = subprocess.run(["ip", "netns", "exec", self.fabric.sw, "nft", "-f", "-"], input=script,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"nft in {self.fabric.sw}: {p.stderr.strip()}")
