#!/usr/bin/env python
"""Container health check: GET http://<address>:<port><path> for each port; 0 when all say 200.

Address: $DUALPATH_HOST when concrete, else this container's own address, else 127.0.0.1.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import urllib.request


def address() -> str:
    host = os.environ.get("DUALPATH_HOST", "")
    if host and host not in ("0.0.0.0", "::"):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dualpath-healthcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--path", default="/metrics")
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("ports", nargs="+", type=int)
    args = ap.parse_args(argv)
    host = address()
    for port in args.ports:
        url = f"http://{host}:{port}{args.path}"
        try:
            with urllib.request.urlopen(url, timeout=args.timeout) as resp:
                if resp.status != 200:
                    print(f"{url}: HTTP {resp.status}", file=sys.stderr)
                    return 1
        except OSError as exc:
            print(f"{url}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
