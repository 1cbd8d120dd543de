"""Control-plane messages (msgspec Structs), grouped by subject family.

- `registry`: announcements/heartbeats every service publishes (`{ns}.hb`).
- `work`: requests handed to engines (`{ns}.pe.<id>.work`, `{ns}.de.<id>.admit`, `{ns}.cancel`).
- `stream`: tokens flowing back to the scheduler (`{ns}.out.<scheduler>`).
- `tm`: traffic-manager control (`{ns}.tm.<engine>.*`); the bytes move on the data plane.
- `storage`: storage-gateway control (`{ns}.sg.<node>.*`).

Schema evolution: new fields get defaults; existing field types never change.
"""
