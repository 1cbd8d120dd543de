"""`dualpath up`: the whole mesh on this machine with embedded defaults, until Ctrl-C.

Prints the serving line once the engines are warmed up; a start-up failure is one line, exit 1.
Once serving, a dead process is restarted (dualpath/supervisor.py); Ctrl-C or SIGTERM stops all.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
import urllib.request
from typing import Callable

# The warm-up's request: its prompt and answer fit in one partial KV block, so it stores nothing.
WARM_UP = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run the whole mesh on this machine (nats-server + every service)",
                       description="Run the whole mesh on this machine: an embedded nats-server and every service "
                                   "as its own process, until Ctrl-C. Ready in about 10 s with --model tiny, "
                                   "20-30 s with smollm2 (plus a one-time 98 MB download), after one small chat "
                                   "completion per engine has warmed the engines up. Once serving, a process "
                                   "that dies is restarted after 0.5 s, doubling up to 10 s in a crash loop.")
    p.add_argument("--model", default="smollm2",
                   help="preset (smollm2, tiny, tiny-mla), a .gguf file or an HF directory")
    p.add_argument("--device", default="cpu", help="where both engines put the model and KV memory: cpu, cuda, cuda:N")
    p.add_argument("--port", type=int, default=8000, help="HTTP port of the OpenAI-style API (0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="bind address of every listener")
    p.add_argument("--prefill", type=int, default=1, help="prefill nodes")
    p.add_argument("--decode", type=int, default=1, help="decode nodes")
    p.add_argument("--engines-per-node", type=int, default=1, help="engines (each with its traffic-manager) per node")
    p.add_argument("--kv-blocks", type=int, default=256, help="KV blocks per engine")
    p.add_argument("--tm-nice", type=int, default=10,
                   help="CPU niceness of the traffic managers, 0..19: on this host's shared cores an engine's "
                        "forward has a core first (0 = as started)")
    p.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp", "verbs"],
                   help="data plane between traffic-managers (auto: shm within this host)")
    p.add_argument("--store", default="", help="KV store directory, kept across runs (empty: ~/.cache/dualpath/store, "
                                               "shared by every run with this home; an empty directory starts clean)")
    p.add_argument("--nats", default="", help="use this NATS server (nats://host:port) instead of starting one")
    p.add_argument("--netns", action="store_true",
                   help="hosts as network namespaces (root): each node, the scheduler and NATS in its own, joined "
                        "by veth links to a bridge; KV between nodes moves over real TCP")
    p.add_argument("--link-gbps", type=float, default=0.0,
                   help="with --netns: each node's link rate both ways in Gbit/s, enforced by tc (0 = unlimited)")
    p.add_argument("--link-latency-ms", type=float, default=0.0,
                   help="with --netns: delay added to every packet a node sends, in ms")
    p.add_argument("--log-dir", default="", help="keep each process's log here (empty: a temporary directory, "
                                                 "removed on exit unless something failed)")
    p.add_argument("--debug", action="store_true", help="on failure, print the traceback and the failed log's tail")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dualpath.mesh import Mesh, MeshError, MeshSpec
    from dualpath.supervisor import Supervisor
    from shared.http import PortInUse
    from shared.transport.registry import choose as choose_transport

    on = _checked(args)
    spec = MeshSpec(model=args.model, port=args.port, host=args.host, prefill=args.prefill, decode=args.decode,
                    engines_per_node=args.engines_per_node, kv_blocks=args.kv_blocks, transport=args.transport,
                    store=args.store, nats_url=args.nats, log_dir=args.log_dir, tm_nice=args.tm_nice,
                    extra={"prefill_engine": on, "decode_engine": on} if on else {}, netns=args.netns,
                    link_gbps=args.link_gbps, link_latency_ms=args.link_latency_ms)
    mesh = Mesh(spec)
    stop = _Stop()
    supervisor = None
    try:
        mesh.bind_http()  # a taken --port fails here, before anything starts
        where = mesh.log_dir if args.log_dir else f"{mesh.log_dir}, removed on exit unless something fails"
        print(f"starting the mesh (logs: {where}) ...", flush=True)
        print("data plane: %s transport (%s)" % choose_transport(args.transport), flush=True)
        if args.netns:
            rate = f"{args.link_gbps:g} Gbit/s" if args.link_gbps else "unlimited"
            print(f"hosts: network namespaces, node links {rate}, +{args.link_latency_ms:g} ms; "
                  f"between nodes KV moves over tcp", flush=True)
        mesh.start(progress=lambda line: print(line, flush=True))
        warm_up(mesh.url, max(args.prefill, args.decode) * args.engines_per_node, lambda s: print(s, flush=True))
        stop.serving()
        print(f"serving {mesh.url}  (OpenAI API: {mesh.url}/v1/completions; Ctrl-C stops)", flush=True)
        supervisor = Supervisor(mesh, say=lambda line: print(line, flush=True))
        while not stop.wait(0.2):
            supervisor.tick()
    except KeyboardInterrupt:
        print("stopped during start-up", flush=True)
        return 130
    except (PortInUse, MeshError) as exc:
        if args.debug:
            traceback.print_exc()
            if getattr(exc, "log_tail", ""):
                print(f"--- last lines of {exc.log} ---\n{exc.log_tail}", file=sys.stderr)
        print(f"dualpath up: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if stop.stopping() == "serving":
            print("stopping ...", flush=True)
        mesh.stop()  # after a failed start: already stopped, this only reaps
        if supervisor and supervisor.restarts():
            counts = ", ".join(f"{name} {n}" for name, n in sorted(supervisor.restarts().items()))
            print(f"restarts: {counts} (logs kept: {mesh.log_dir})", flush=True)
    return 0


def _checked(args: argparse.Namespace) -> dict[str, str]:
    """Check the flags before anything starts (CliError names the bad one); returns the device setting."""
    from dualpath.cli import CliError

    for name in ("prefill", "decode", "engines_per_node", "kv_blocks"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not 0 <= args.port < 65536:
        raise CliError(f"--port {args.port} is not a port number")
    if not 0 <= args.tm_nice <= 19:
        raise CliError(f"--tm-nice {args.tm_nice}: a niceness, 0..19")
    if (args.link_gbps or args.link_latency_ms) and not args.netns:
        raise CliError("--link-gbps and --link-latency-ms shape namespace links: add --netns")
    if args.link_gbps < 0 or args.link_latency_ms < 0:
        raise CliError(f"--link-gbps {args.link_gbps:g} / --link-latency-ms {args.link_latency_ms:g} must be >= 0")
    if args.netns and args.nats:
        raise CliError("--nats with --netns: the namespaces reach only the NATS server the mesh starts itself")
    if args.netns:
        from dualpath.netns.fabric import probe

        why = probe()
        if why:
            raise CliError(f"--netns: {why}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise CliError(f"--device {args.device!r}: want cpu, cuda or cuda:N")
    on = {}
    if args.device != "cpu":
        from shared.config import ConfigError
        from shared.engine.service import check_device

        try:
            check_device(args.device)  # said now, not by two engines failing to start
        except ConfigError as exc:
            raise CliError(f"--device {args.device}: {exc.reason}") from exc
        on = {"device": args.device}
    return on


def warm_up(url: str, requests: int, say: Callable[[str], None], timeout: float = 300.0) -> list[str]:
    """`requests` small completions at once (one per engine) before serving; returns failures (not fatal)."""
    say(f"warming up the engines ({requests} small chat completion{'s' if requests > 1 else ''}) ...")
    t0, errors = time.monotonic(), []
    threads = [threading.Thread(target=_complete, args=(url, timeout, errors), daemon=True) for _ in range(requests)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    said = f"{errors[0]} (serving anyway)" if errors else f"done in {time.monotonic() - t0:.1f} s"
    say(f"warm-up: {said}")
    return errors


def _complete(url: str, timeout: float, errors: list[str]) -> None:
    headers = {"Content-Type": "application/json"}
    key = _api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(WARM_UP).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
    except Exception as exc:  # noqa: BLE001 - an HTTP error, a timeout, a reset: each is said the same way
        errors.append(f"a warm-up request failed: {exc}")


def _api_key() -> str | None:
    """One API key the scheduler requires (DUALPATH_CONFIG or the environment), or None."""
    from services.scheduler.config import SchedulerConfig
    from shared.config import ConfigError, load_config

    try:
        keys = load_config(SchedulerConfig, "scheduler", file=os.environ.get("DUALPATH_CONFIG")).api_keys
    except (ConfigError, OSError, ValueError):
        return None  # the scheduler, reading the same, would not have started
    return keys[0] if keys else None


class _Stop:
    """Ctrl-C / SIGTERM: interrupts start-up, ends the serve loop, is ignored while stopping."""

    def __init__(self):
        self.event = threading.Event()
        self.state = "starting"
        for sig in (signal.SIGINT, signal.SIGTERM):  # also when started with SIGINT ignored
            signal.signal(sig, self._on_signal)

    def _on_signal(self, *_) -> None:
        if self.state == "starting":
            self.state = "interrupted"
            raise KeyboardInterrupt
        self.event.set()

    def serving(self) -> None:
        self.state = "serving"

    def stopping(self) -> str:
        """Enter the stopping state; returns the state it leaves."""
        was, self.state = self.state, "stopping"
        return was

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)
