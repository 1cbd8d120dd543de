"""A Docker daemon for the compose check: use the running one, else start the installed `dockerd`.

`stop()` ends only a dockerd started here; nothing is ever installed.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from stack import daemon_reachable

DOCKERD_CANDIDATES = ("/usr/sbin/dockerd", "/usr/bin/dockerd")


class DaemonError(RuntimeError):
    """dockerd is missing or did not come up; `log` is where its output went (if started)."""

    def __init__(self, message: str, log: Path | None = None):
        super().__init__(message + (f" (log: {log})" if log else ""))
        self.log = log


def dockerd_path() -> str | None:
    found = shutil.which("dockerd")
    if found:
        return found
    return next((p for p in DOCKERD_CANDIDATES if os.access(p, os.X_OK)), None)


@dataclass
class Daemon:
    started: subprocess.Popen | None  # None: it was already running (not ours to stop)
    log: Path | None

    def stop(self, timeout: float = 60.0) -> None:
        if self.started is None or self.started.poll() is not None:
            return
        self.started.send_signal(signal.SIGTERM)
        try:
            self.started.wait(timeout)
        except subprocess.TimeoutExpired:
            self.started.kill()
            self.started.wait()


def ensure(log_dir: Path, timeout: float = 120.0) -> Daemon:
    """A reachable daemon: the running one, or dockerd started here (waits until `docker info` answers)."""
    if daemon_reachable() is None:
        return Daemon(None, None)
    exe = dockerd_path()
    if exe is None:
        raise DaemonError("no Docker daemon reachable and no dockerd installed")
    if os.geteuid() != 0:
        raise DaemonError(f"no Docker daemon reachable; starting {exe} needs root")
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "dockerd.log"
    proc = subprocess.Popen([exe], stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise DaemonError(f"{exe} exited with code {proc.returncode}", log)
        if daemon_reachable() is None:
            return Daemon(proc, log)
        time.sleep(0.5)
    Daemon(proc, log).stop()
    raise DaemonError(f"{exe} did not answer within {timeout:.0f}s", log)
