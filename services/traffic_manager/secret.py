"""Where a traffic manager's data-plane secret comes from: its setting, else the mesh's bus.

In order: `data_plane_secret` when set; else the mesh's own in the JetStream bucket
`<namespace>-mesh` (the first TM creates it atomically); else, without JetStream, the process's
own (then it reaches only endpoints of its process). Owns the lookup only."""
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
    """The secret to hand to the endpoint; None: the process's own."""
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
