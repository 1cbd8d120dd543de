"""`dualpath up`: the whole mesh on this machine with embedded defaults, until Ctrl-C."""
from __future__ import annotations

import argparse
import signal
import threading


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run the whole mesh on this machine (nats-server + every service)")
    p.add_argument("--model", default="smollm2", help="preset (smollm2, tiny), a .gguf file or an HF directory")
    p.add_argument("--port", type=int, default=8000, help="HTTP port of the OpenAI-style API")
    p.add_argument("--host", default="127.0.0.1", help="bind address of every listener")
    p.add_argument("--prefill", type=int, default=1, help="prefill nodes")
    p.add_argument("--decode", type=int, default=1, help="decode nodes")
    p.add_argument("--engines-per-node", type=int, default=1)
    p.add_argument("--kv-blocks", type=int, default=256, help="KV blocks per engine")
    p.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp", "verbs"])
    p.add_argument("--store", default="", help="KV store directory (default: ~/.cache/dualpath/store)")
    p.add_argument("--nats", default="", help="use this NATS server instead of starting one")
    p.add_argument("--log-dir", default="", help="where each process writes its log")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dualpath.cli import CliError
    from dualpath.mesh import Mesh, MeshError, MeshSpec

    for name in ("prefill", "decode", "engines_per_node", "kv_blocks"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not 0 <= args.port < 65536:
        raise CliError(f"--port {args.port} is not a port number")
    spec = MeshSpec(model=args.model, port=args.port, host=args.host, prefill=args.prefill, decode=args.decode,
                    engines_per_node=args.engines_per_node, kv_blocks=args.kv_blocks, transport=args.transport,
                    store=args.store, nats_url=args.nats, log_dir=args.log_dir)
    mesh = Mesh(spec)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, or a supervisor's stop
        signal.signal(sig, lambda *_: stop.set())
    print(f"starting the mesh (logs in {mesh.log_dir}) ...", flush=True)
    try:
        mesh.start()
        print(f"serving {mesh.url}  (OpenAI API: {mesh.url}/v1/completions; Ctrl-C stops)", flush=True)
        while not stop.wait(1.0):
            mesh.check_alive()
    except KeyboardInterrupt:
        pass
    except MeshError as exc:
        print(f"dualpath up: {exc}", flush=True)
        return 1
    finally:
        print("stopping ...", flush=True)
        mesh.stop()
    return 0
