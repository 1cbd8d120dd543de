"""Traffic-manager settings."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from shared.config import require
from shared.service_config import CommonConfig

BACKENDS = ("auto", "shm", "tcp", "verbs")
ALLOW_FAULTS = "DUALPATH_ALLOW_FAULTS"  # the environment must say this too before a fault switch is taken


@dataclass(frozen=True)
class TrafficManagerConfig(CommonConfig):
    engine: str = ""  # the engine this TM serves (required)
    transport: str = "auto"  # auto | shm | tcp | verbs
    data_port: int = 0  # data-plane listener (tcp); 0 = any free port
    buffer_mb: int = 512  # DRAM buffer (PE/DE buffer) in MiB, POSIX shared memory
    transfer_timeout_s: float = 30.0  # every KV transfer has a deadline; layer waits: this long after the last progress
    latency_weight: int = 99  # traffic-class weights (latency : bulk), work-conserving
    bulk_weight: int = 1  # bulk share of the traffic-class weights (see latency_weight)
    read_layer_groups: int = 8  # a storage read lands in this many groups of layers, each reported (1: whole blocks)
    save_queue_blocks: int = 4096  # saves waiting for buffer room, in blocks; a save past this is dropped (counted)
    save_wait_s: float = 10.0  # longest wait of a save for buffer room (at most half of transfer_timeout_s)
    data_plane_secret: str = field(default="", repr=False)  # tcp peers' shared secret; empty = the mesh's own, on its NATS (JetStream)
    prefetch_share: float = 0.5  # most of the buffer prefetched blocks may hold (agent sessions' tool calls)
    prefetch_chunk_blocks: int = 8  # most blocks per bulk read of a prefetch (a latency read waits behind one at most; 10 ms of a rate-capped storage NIC)
    pending_hold_s: float = 0.0  # a DE turn's saved blocks wait this long in the buffer for the scheduler to offer them to the next turn (0: not kept; 10 with scheduler serve_pending_saves)
    fault_flip_pending_bytes: bool = False  # TESTS ONLY, refused unless DUALPATH_ALLOW_FAULTS=1: corrupt the first block of the first kept turn offered
    fault_flip_de_bytes: bool = False  # TESTS ONLY, refused unless DUALPATH_ALLOW_FAULTS=1: corrupt each DE-path read after its checksum passed


    def validate(self) -> None:
        require(bool(self.engine), "engine", self.engine, "name the engine this traffic-manager serves")
        require(self.transport in BACKENDS, "transport", self.transport, f"one of {', '.join(BACKENDS)}")
        require(self.buffer_mb > 0, "buffer_mb", self.buffer_mb, "must be > 0")
        require(self.read_layer_groups >= 1, "read_layer_groups", self.read_layer_groups, "must be >= 1")
        require(self.save_queue_blocks > 0, "save_queue_blocks", self.save_queue_blocks, "must be > 0")
        require(self.save_wait_s > 0, "save_wait_s", self.save_wait_s, "must be > 0")
        require(self.latency_weight > 0 and self.bulk_weight > 0, "latency_weight/bulk_weight",
                (self.latency_weight, self.bulk_weight), "weights must be > 0")
        require(0 <= self.prefetch_share <= 1, "prefetch_share", self.prefetch_share, "a share of the buffer, 0..1")
        require(self.prefetch_chunk_blocks > 0, "prefetch_chunk_blocks", self.prefetch_chunk_blocks, "must be > 0")
        require(self.pending_hold_s >= 0, "pending_hold_s", self.pending_hold_s, "must be >= 0")
        require(not self.fault_flip_pending_bytes or os.environ.get(ALLOW_FAULTS) == "1", "fault_flip_pending_bytes",
                True, f"a fault-injection switch for tests: it serves wrong KV on purpose; refused unless {ALLOW_FAULTS}=1")
        require(not self.fault_flip_de_bytes or os.environ.get(ALLOW_FAULTS) == "1", "fault_flip_de_bytes", True,
                f"a fault-injection switch for tests: it serves wrong KV on purpose; refused unless {ALLOW_FAULTS}=1")
