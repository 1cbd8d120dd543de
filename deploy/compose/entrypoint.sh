#!/usr/bin/env bash
# Image entry point. `<service> [flags]` runs `dualpath service <service> [flags]`;
# prefill-engine / decode-engine run with their traffic-manager (dualpath-engine-entry);
# anything else (`dualpath plan ...`, `bash`) is run as given.
# `host` (bind + announced address of /metrics and the data plane) defaults to this
# container's address on the compose network: 0.0.0.0 would be announced as is and
# peers cannot connect to it.
set -euo pipefail

container_ip() {
    python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'
}

case "${1:-}" in
    prefill-engine|decode-engine)
        exec dualpath-engine-entry "$@" ;;
    scheduler|storage-gateway|traffic-manager)
        service="$1"; shift
        export DUALPATH_HOST="${DUALPATH_HOST:-$(container_ip)}"
        exec dualpath service "$service" "$@" ;;
    "")
        echo "usage: <scheduler|prefill-engine|decode-engine|traffic-manager|storage-gateway> [flags]" >&2
        exit 2 ;;
    *)
        exec "$@" ;;
esac
