"""A nats-server the test owns, which it can kill and restart in place.

The first start binds any free port (`-p -1`): the server itself picks it and writes it to
`<name>_<pid>.ports` in `--ports_file_dir`, so no other process can take the port between
choosing and binding it. A restart binds the port the first start got (clients reconnect to
the same URL); should another process have taken it meanwhile, it retries a few times and then
raises `NatsStartError` naming the port.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

from dualpath.mesh import nats_server_binary

IN_USE = "address already in use"


class NatsStartError(RuntimeError):
    """nats-server did not come up: `port` (0 before the first start) and the log's `tail`."""

    def __init__(self, message: str, port: int, tail: str):
        super().__init__(f"{message} (port {port}): {tail}")
        self.port, self.tail = port, tail


class NatsServer:
    def __init__(self, tmp_path: Path, jetstream: bool = False, log: str = "nats.log"):
        self.port = 0  # known after the first start
        self.args = [nats_server_binary(), "-a", "127.0.0.1"]
        if jetstream:
            self.args += ["-js", "-sd", str(tmp_path / "js")]
        self.log = tmp_path / log
        self.ports_dir = tmp_path / (log + ".ports")
        self.proc: subprocess.Popen | None = None
        self._log_from = 0

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the nats-server has not started yet: no port")
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0, attempts: int = 5) -> "NatsServer":
        """Start and wait until it accepts connections (so no in-process client sees a refused
        connect). The first start takes any free port; later ones take that port again."""
        if not self.port:
            self.port = self._launch(-1, timeout)
            return self
        for attempt in range(attempts):
            try:
                self._launch(self.port, timeout)
                return self
            except NatsStartError as exc:
                if IN_USE not in exc.tail or attempt == attempts - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))  # back off: the port's holder may let go
        raise AssertionError("unreachable")

    def _launch(self, port: int, timeout: float) -> int:
        """Run nats-server on `port` (-1: any) until it reports, in its ports file, the port it
        listens on and accepts a connection there; returns that port."""
        self.ports_dir.mkdir(exist_ok=True)
        for stale in self.ports_dir.glob("*.ports"):  # left by a killed run (its pid may come back)
            stale.unlink()
        with open(self.log, "ab") as fh:
            self._log_from = fh.tell()  # this run's lines start here (the log spans restarts)
            self.proc = subprocess.Popen(self.args + ["-p", str(port), "--ports_file_dir", str(self.ports_dir)],
                                         stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsStartError("nats-server exited", max(port, 0), self._tail())
            got = self._reported_port()
            if got and self._accepts(got):
                return got
            time.sleep(0.02)
        self.stop()
        raise NatsStartError(f"nats-server not listening within {timeout:.0f}s", max(port, 0), self._tail())

    def _reported_port(self) -> int:
        """The client port from the ports file the server writes once it listens (0: not yet)."""
        assert self.proc is not None
        for path in self.ports_dir.glob(f"*_{self.proc.pid}.ports"):
            try:
                urls = json.loads(path.read_text())["nats"]
            except (ValueError, KeyError, OSError):
                return 0  # written but not complete yet
            return int(urls[0].rsplit(":", 1)[1])
        return 0

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def _tail(self) -> str:
        """The end of this run's log lines."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self._log_from)
                return fh.read().decode(errors="replace")[-2000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """kill -9: no goodbye to the clients, as when the host dies."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
