"""Control-plane messages (msgspec Structs), grouped by subject family.

- `registry`: announcements/heartbeats every service publishes (`{ns}.hb`).
- `work`: requests handed to engines (`{ns}.prefill_engine.<id>.work`, `{ns}.decode_engine.<id>.admit`, `{ns}.cancel`).
- `stream`: tokens flowing back to the scheduler (`{ns}.scheduler.<scheduler>.out`).
- `traffic_manager`: traffic-manager control (`{ns}.traffic_manager.<engine>.*`); the bytes move on the data plane.
- `storage_gateway`: storage-gateway control (`{ns}.storage_gateway.<node>.*`).
- `codes`: the enums every family uses (LoadMode, FinishReason, ErrorCode); no messages.
- `front`: a scheduler's front-door workers and its core (`{ns}.scheduler.<core>.front`, `.ask`, `.info`).
- `journal`: the scheduler's request journal on JetStream (`{ns}.journal.*`); `fleet`: the emulator's own.
- `endpoints`: the table of every subject with its message (and reply) type, the only place a subject
  is built (`typed_subject`: the mechanics; `subjects`: one mesh's); the bus sends and decodes by it.

On the wire: enums as their string values, block keys and fingerprints as raw bytes, one
message type per meaning (no sentinel integers), and a `code: ErrorCode` on every failure a
receiver acts on. Schema evolution: new fields get defaults; existing field types never
change. (The one exception so far is the change to this typed protocol, which changed
the types of `finish`, the key and fingerprint fields and the fetch progress messages:
every process of a mesh must run the same version across it; so did the one name every block-key
field got: `block_keys`, `block_key`, `adopt_block_keys`, where map keys were `keys`, `key`, `adopt_keys`.)
"""
