"""Control-plane messages (msgspec Structs), grouped by subject family.

- `registry`: announcements/heartbeats every service publishes (`{ns}.hb`).
- `work`: requests handed to engines (`{ns}.prefill_engine.<id>.work`, `{ns}.decode_engine.<id>.admit`, `{ns}.cancel`).
- `stream`: tokens flowing back to the scheduler (`{ns}.scheduler.<scheduler>.out`).
- `traffic_manager`: traffic-manager control (`{ns}.traffic_manager.<engine>.*`); the bytes move on the data plane.
- `storage_gateway`: storage-gateway control (`{ns}.storage_gateway.<node>.*`).

Schema evolution: new fields get defaults; existing field types never change.
"""
