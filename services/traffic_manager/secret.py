"""Where a traffic manager's data-plane secret comes from: its setting, else the mesh's bus.

Owns the lookup only (tcp_auth.py owns the handshake). Every traffic manager of one mesh
must hold the same secret, or their tcp connections are refused. In order:
1. the setting `data_plane_secret` (`DUALPATH_DATA_PLANE_SECRET`), when it is not empty;
2. else the mesh's own, kept on its NATS server in the JetStream key-value bucket
   `<namespace>-mesh`, key `data-plane-secret`: the first traffic manager to start
   creates it (an atomic create: of two racing, one wins, the other reads the winner's),
   every later one reads it. The bus is as trusted as the secret: a client that may read
   the mesh's subjects may read the bucket, so guard NATS with credentials;
3. else (no JetStream on the server) the process's own secret, with a warning: this
   traffic manager then talks only to endpoints of its own process.
"""
from __future__ import annotations

import logging
import secrets

import nats.errors
import nats.js.errors

log = logging.getLogger("traffic_manager")
KEY = "data-plane-secret"


def bucket_name(namespace: str) -> str:
    return f"{namespace}-mesh".replace(".", "_")


async def mesh_secret(nc: nats.NATS, namespace: str, setting: str, timeout_s: float = 2.0) -> str | None:
    """The secret to hand to the endpoint; None = the process's own (see the module docstring)."""
    if setting:
        return setting
    js = nc.jetstream(timeout=timeout_s)
    try:
        try:
            kv = await js.key_value(bucket_name(namespace))
        except nats.js.errors.BucketNotFoundError:
            kv = await js.create_key_value(bucket=bucket_name(namespace), history=1)
        try:
            await kv.create(KEY, secrets.token_hex(32).encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # another traffic manager of this mesh made it first
        entry = await kv.get(KEY)
        return entry.value.decode() if entry.value else None
    except (nats.js.errors.ServiceUnavailableError, nats.js.errors.NoStreamResponseError,
            nats.errors.TimeoutError, nats.js.errors.APIError) as exc:
        log.warning("data plane: no data_plane_secret set and none on the bus (%s: JetStream off?); this "
                    "traffic manager accepts only peers of its own process: set data_plane_secret on every "
                    "traffic manager of the mesh", type(exc).__name__)
        return None
