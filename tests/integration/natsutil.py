"""A nats-server the test owns: on a fixed free port, so it can be killed and restarted in place."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

from dualpath.mesh import free_port, nats_server_binary


class NatsServer:
    def __init__(self, tmp_path: Path, jetstream: bool = False, log: str = "nats.log"):
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)]
        if jetstream:
            self.args += ["-js", "-sd", str(tmp_path / "js")]
        self.log = tmp_path / log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "NatsServer":
        """Start and wait until it accepts connections (so no in-process client sees a refused connect)."""
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(self.args, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"nats-server not listening on {self.port}")

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
