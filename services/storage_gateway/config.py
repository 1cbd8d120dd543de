"""Storage-gateway settings (one gateway per node)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from shared.config import require
from shared.service_config import CommonConfig


def default_store() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dualpath", "store")


@dataclass(frozen=True)
class StorageGatewayConfig(CommonConfig):
    store: str = ""  # store root (a directory or shared POSIX mount); empty = user cache dir
    capacity_gb: float = 0.0  # byte limit with LRU eviction; 0 = unlimited
    snic_read_gbps: float = 0.0  # emulated storage-NIC read cap in Gbit/s (a test setting); 0 = uncapped
    snic_write_gbps: float = 0.0  # emulated storage-NIC write cap in Gbit/s; 0 = uncapped
    io_threads: int = 4  # threads doing storage file I/O
    inline_read_mib: float = 8.0  # warm one-stripe reads up to this many MiB are copied by the event loop (no thread hop); 0 = never (a mount where open() is a network round trip)

    @property
    def store_root(self) -> str:
        return self.store or default_store()

    def validate(self) -> None:
        require(self.capacity_gb >= 0, "capacity_gb", self.capacity_gb, "must be >= 0")
        require(self.snic_read_gbps >= 0, "snic_read_gbps", self.snic_read_gbps, "must be >= 0")
        require(self.snic_write_gbps >= 0, "snic_write_gbps", self.snic_write_gbps, "must be >= 0")
        require(self.inline_read_mib >= 0, "inline_read_mib", self.inline_read_mib, "must be >= 0")
        require(self.io_threads > 0, "io_threads", self.io_threads, "must be > 0")
